"""One runtime's hand-over, end to end, in one process: the Compass simulator with its
certificate-secured side (`devenv.compass_sim.mtls`), a broker that answers the agent's token
requests with real Director one-time tokens, and our agent (`agent.process.Agent`) on the caller's
event loop, all against a runtime API server the caller started. Whichever compass-runtime-agent
(the real one, `devenv.runtime_agent.RealRuntimeAgent`, or `devenv.runtime_agent_sim`) the
caller runs against the same cluster reads the Secret our agent writes.

Used by `python -m bench.handover` and the contract test in
`tests/integration/real_runtime_agent/`. Observations: the CompassConnection's state, Director
one-time tokens issued, our agent's connection reports (with their arrival time), and every
Connector and certificate-secured call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self, cast

import httpx
from kubernetes.client.exceptions import ApiException

from agent.process import Agent
from agent.settings import AgentSettings
from devenv.clusters import TestCluster, free_port
from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.mtls import CertificateSecuredCompass
from devenv.compass_sim.testing import REQUEST_ONE_TIME_TOKEN, DirectorClient

__all__ = ["CC", "Handover", "Report", "TokenBroker"]

CC = ("compass.kyma-project.io", "v1alpha1", "compassconnections")
CONNECTION = "compass-connection"
KYMA = ("operator.kyma-project.io", "v1beta2", "kymas")
OTT = "requestOneTimeTokenForRuntime"
CONNECTOR_OPERATIONS = ("configuration", "signCertificateSigningRequest")
TENANT = "global-account-1"


@dataclass(frozen=True)
class Report:
    at: float  # time.monotonic() on arrival
    body: dict[str, Any]

    @property
    def state(self) -> str:
        return str(self.body.get("connectionState", ""))


class TokenBroker:
    """The broker's two endpoints, as far as one agent needs them: `POST …/token` costs one
    Director `requestOneTimeTokenForRuntime` (as with the real broker), `POST …/connection`
    records the report and answers 202."""

    def __init__(self, issue: Callable[[], dict[str, Any]]) -> None:
        self._issue = issue
        self.port = free_port()
        self.reports: list[Report] = []
        self.token_requests = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body: dict[str, Any]
        try:
            line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = raw.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            payload = await reader.readexactly(int(headers.get("content-length", "0")))
            path = line.split()[1] if len(line.split()) > 1 else ""
            if path.endswith("/connection"):
                self.reports.append(Report(time.monotonic(), json.loads(payload or b"{}")))
                status, body = 202, {"nextReportAfterSeconds": 3600}
            elif path.endswith("/token"):
                self.token_requests += 1
                status, body = 201, await asyncio.to_thread(self._issue)
            else:
                status, body = 404, {"type": "not-found", "status": 404}
            data = json.dumps(body).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@dataclass
class Handover:
    """`async with Handover(cluster, workdir, runtime_id=…) as h:` starts Compass, the broker
    and our agent (module not enabled yet: `h.enable_module()`); everything stops on exit."""

    cluster: TestCluster
    workdir: Path
    runtime_id: str
    namespace: str = "kyma-system"
    agent_settings: dict[str, Any] = field(default_factory=dict)
    sim: CompassSimulator = field(init=False)
    secured: CertificateSecuredCompass = field(init=False)
    broker: TokenBroker = field(init=False)
    compass_runtime_id: str = field(init=False, default="")
    _director: DirectorClient | None = field(init=False, default=None)
    _agent_stop: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _agent_task: asyncio.Task[None] | None = field(init=False, default=None)
    _stack: contextlib.AsyncExitStack = field(init=False, default_factory=contextlib.AsyncExitStack)

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        config = SimConfig(client_id="id", client_secret="secret")  # noqa: S106 - a test double
        self.sim = CompassSimulator(config)
        self.sim.start()
        self._stack.callback(self.sim.stop)
        self.secured = CertificateSecuredCompass(self.sim).start()
        self._stack.callback(self.secured.stop)
        runtime = self.sim.seed_runtime(tenant=TENANT, name=f"handover-{self.runtime_id}")
        self.compass_runtime_id = runtime.id
        http = httpx.Client(timeout=10)
        self._stack.callback(http.close)
        self._director = DirectorClient(
            http, self.sim.director_url, token=self.sim.issue_access_token(), tenant=TENANT
        )
        self.broker = TokenBroker(self._issue)
        await self.broker.start()
        self._stack.push_async_callback(self.broker.stop)
        self.cluster.create_namespace(self.namespace)
        self._clean_cluster()  # what an earlier run on this cluster left
        self._stack.callback(self._clean_cluster)
        await self._start_agent()

    def _issue(self) -> dict[str, Any]:
        assert self._director is not None
        ott = self._director.result(REQUEST_ONE_TIME_TOKEN, {"id": self.compass_runtime_id})
        expires = datetime.now(UTC) + timedelta(minutes=60)
        return {
            "token": ott["token"],
            "connectorURL": ott["connectorURL"],
            "compassRuntimeID": self.compass_runtime_id,
            "tenant": TENANT,
            "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    async def _start_agent(self) -> None:
        token_file = self.workdir / "sa-token"
        token_file.parent.mkdir(parents=True, exist_ok=True)
        token_file.write_text("fake-sa-token")  # the token broker does not check identities
        values: dict[str, Any] = {
            "broker_url": self.broker.url,
            "namespace": self.namespace,
            "kubeconfig": self.cluster.kubeconfig_path,
            "sa_token_file": token_file,
            "health_address": "127.0.0.1:0",
            "identity": "handover-agent",
            **self.agent_settings,
        }
        agent = Agent(AgentSettings(**values))
        self._agent_stop = asyncio.Event()
        self._agent_task = asyncio.create_task(agent.run(self._agent_stop))
        self._stack.push_async_callback(self._stop_agent)
        await asyncio.wait_for(agent.started.wait(), timeout=30)

    async def _stop_agent(self) -> None:
        self._agent_stop.set()
        if self._agent_task is not None:
            await asyncio.wait_for(self._agent_task, timeout=30)

    def _clean_cluster(self) -> None:
        with contextlib.suppress(ApiException):  # the module disabled: no Kyma CR
            self.cluster.custom.delete_namespaced_custom_object(
                *KYMA[:2], self.namespace, KYMA[2], "default"
            )
        self.delete_connection()
        for name in ("compass-agent-configuration", "cluster-client-certificates"):
            with contextlib.suppress(ApiException):
                self.cluster.core.delete_namespaced_secret(name, self.namespace)

    # -- the runtime ------------------------------------------------------------------

    def enable_module(self, enabled: bool = True) -> None:
        """The Kyma CR `default` with (or without) application-connector."""
        modules = [{"name": "application-connector"}] if enabled else []
        metadata: dict[str, Any] = {
            "name": "default",
            "namespace": self.namespace,
            "labels": {"kyma-project.io/runtime-id": self.runtime_id},
        }
        body: dict[str, Any] = {
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "Kyma",
            "metadata": metadata,
            "spec": {"channel": "regular", "modules": modules},
        }
        custom = self.cluster.custom
        try:
            current = cast(
                dict[str, Any],
                custom.get_namespaced_custom_object(*KYMA[:2], self.namespace, KYMA[2], "default"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            custom.create_namespaced_custom_object(*KYMA[:2], self.namespace, KYMA[2], body)
            return
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        custom.replace_namespaced_custom_object(*KYMA[:2], self.namespace, KYMA[2], "default", body)

    def connection(self) -> dict[str, Any] | None:
        try:
            found = self.cluster.custom.get_cluster_custom_object(*CC, CONNECTION)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    def state(self) -> str | None:
        status = (self.connection() or {}).get("status") or {}
        state = status.get("connectionState")
        return str(state) if state else None

    def delete_connection(self) -> None:
        with contextlib.suppress(ApiException):
            self.cluster.custom.delete_cluster_custom_object(*CC, CONNECTION)

    def delete_token_secret(self) -> None:
        self.cluster.core.delete_namespaced_secret("compass-agent-configuration", self.namespace)

    def secret_keys(self, namespace: str, name: str) -> list[str] | None:
        """The data keys of a Secret (sorted), None when it does not exist."""
        try:
            found = self.cluster.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return sorted((found.data or {}).keys())

    def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        try:
            found = self.cluster.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        value = (found.data or {}).get(key)
        return None if value is None else base64.b64decode(value)

    # -- Compass ----------------------------------------------------------------------

    def tokens_issued(self) -> int:
        return self.sim.counter(OTT).successes

    def connector_calls(self) -> dict[str, int]:
        """Token-secured Connector calls (attempts, whatever their outcome)."""
        return {op: self.sim.counter(op).attempts for op in CONNECTOR_OPERATIONS}

    def secured_calls(self) -> dict[str, int]:
        """Certificate-secured Connector and Director calls, per root field."""
        return self.secured.calls()

    def reported_states(self, since: float = 0.0) -> list[str]:
        return [r.state for r in self.broker.reports if r.at >= since]

    def first_report(self, state: str, since: float) -> float | None:
        for report in self.broker.reports:
            if report.at >= since and report.state == state:
                return report.at
        return None
