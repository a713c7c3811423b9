"""Fixtures for running the real agent in-process against a real runtime API server.

`agent_env` gives each test its own namespace (as the agent's `kyma-system`), helpers to shape
the Kyma CR, ApplicationConnector CRs and the cluster-scoped CompassConnection, and `start()`
to run an `agent.process.Agent` on the test's event loop; every agent started is stopped (and
awaited) at teardown, and the CompassConnection is removed so tests stay independent.
`FakeBroker` is a scripted HTTP broker on a free loopback port for the failure-timing tests
(optionally behind TLS that requires a client certificate, recording each caller's CN);
`Pki` makes the CAs and certificates for that; `RecordingTransport` records every request the
agent sends, whether or not anything listens. (`tests.integration.tcp_proxy.TcpProxy` sits
between the agent and the API server so a test can cut every connection.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from agent.process import Agent, Overrides
from agent.settings import AgentSettings
from devenv import pki
from devenv.clusters import TestCluster, free_port

# The broker's own harness (KCP seeding, Compass simulator, broker process), reused as is.
from tests.integration.broker.conftest import (  # noqa: F401 - fixtures are found by name
    broker_crds,
    brokers,
    creds_file,
    kcp_ns,
    sim,
)
from tests.integration.waiting import eventually  # noqa: F401 - the agent tests import it here

KYMA = ("operator.kyma-project.io", "v1beta2", "kymas")
AC = ("operator.kyma-project.io", "v1alpha1", "applicationconnectors")
CC = ("compass.kyma-project.io", "v1alpha1", "compassconnections")
SECRET = "compass-agent-configuration"


# -- a scripted broker ---------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def token_reply(n: int, *, expires_in: timedelta = timedelta(minutes=60)) -> Reply:
    return Reply(
        201,
        {
            "token": f"ott-{n}",
            "connectorURL": "https://connector.test/graphql",
            "compassRuntimeID": "compass-rt-1",
            "tenant": "ga-1",
            "expiresAt": (datetime.now(UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )


def problem_reply(status: int, kind: str, retry_after: str | None = None) -> Reply:
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return Reply(status, {"type": kind, "title": kind, "status": status, "detail": kind}, headers)


class FakeBroker:
    """Answers `POST /v1/runtimes/{id}/token` with `script(n)` for the n-th request (1-based).

    With `tls` it serves HTTPS; `peers` then holds the CN of the client certificate presented
    on each request's connection (None without one). Connection reports
    (`POST /v1/runtimes/{id}/connection`) are accepted (202) and kept apart in `reports`: they
    neither count as requests nor advance the script (`contract_broker` tests them)."""

    def __init__(
        self,
        script: Callable[[int], Reply],
        port: int | None = None,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.script = script
        self.port = port or free_port()
        self.tls = tls
        self.requests: list[tuple[float, str, dict[str, str]]] = []
        self.reports: list[tuple[float, str, dict[str, str]]] = []
        self.report_bodies: list[dict[str, Any]] = []
        self.peers: list[str | None] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, ssl=self.tls
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = raw.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            payload = await reader.readexactly(int(headers.get("content-length", "0")))
            path = line.split()[1]
            if path.endswith("/connection"):
                self.reports.append((time.monotonic(), path, headers))
                self.report_bodies.append(json.loads(payload or b"{}"))
                reply = Reply(202, {"nextReportAfterSeconds": 3600})
            else:
                self.peers.append(_common_name(writer.get_extra_info("peercert")))
                self.requests.append((time.monotonic(), path, headers))
                reply = self.script(len(self.requests))
            body = json.dumps(reply.body).encode()
            head = {"Content-Type": "application/json", **reply.headers}
            text = f"HTTP/1.1 {reply.status} X\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in head.items()
            )
            text += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(text.encode() + body)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _common_name(peercert: Any) -> str | None:
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# -- certificates ------------------------------------------------------------------------------


@dataclass
class Issued:
    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_file: Path, key_file: Path) -> None:
        # The key first and the certificate last, as a rotation that is caught half-way would.
        key_file.write_bytes(self.key_pem)
        cert_file.write_bytes(self.cert_pem)


class Pki:
    """A small CA issuing server and client certificates, for TLS tests only."""

    def __init__(self, name: str) -> None:
        self.ca = pki.new_ca(name)

    @property
    def cert_pem(self) -> bytes:
        return self.ca.cert_pem

    def issue(self, common_name: str, *, server: bool) -> Issued:
        pair = pki.issue(
            self.ca,
            common_name=common_name,
            server_hosts=("127.0.0.1",) if server else (),
            client=not server,
        )
        return Issued(pair.cert_pem, pair.key_pem)


def mtls_server_context(folder: Path, server_ca: Pki, client_ca: Pki) -> ssl.SSLContext:
    """A server context that REQUIRES a client certificate signed by `client_ca`."""
    server = server_ca.issue("broker.test", server=True)
    cert_file, key_file, ca_file = folder / "srv.crt", folder / "srv.key", folder / "client-ca.crt"
    server.write(cert_file, key_file)
    ca_file.write_bytes(client_ca.cert_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert_file), str(key_file))
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=str(ca_file))
    return context


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes requests to a real transport and notes when each token request was sent (the
    connection reports that go alongside are passed on unrecorded)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[float] = []
        self.answers: list[tuple[float, int, str | None]] = []  # (time, status, Retry-After)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/connection"):
            return await self.inner.handle_async_request(request)
        self.sent.append(time.monotonic())
        response = await self.inner.handle_async_request(request)
        self.answers.append(
            (time.monotonic(), response.status_code, response.headers.get("Retry-After"))
        )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- the runtime side ------------------------------------------------------------------------


@dataclass
class RunningAgent:
    agent: Agent
    stop_event: asyncio.Event
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.stop_event.set()
        await asyncio.wait_for(self.task, timeout=20)


@dataclass
class AgentEnv:
    cluster: TestCluster
    namespace: str
    workdir: Path
    runtime_id: str
    running: list[RunningAgent] = field(default_factory=list)

    # settings and processes

    def settings(self, broker_url: str, **changes: Any) -> AgentSettings:
        token_file = self.workdir / "sa-token"
        if not token_file.exists():
            token_file.write_text("fake-sa-token")
        values: dict[str, Any] = {
            "broker_url": broker_url,
            "namespace": self.namespace,
            "kubeconfig": self.cluster.kubeconfig_path,
            "sa_token_file": token_file,
            "health_address": "127.0.0.1:0",
            "backoff_base": 0.2,
            "backoff_cap": 2.0,
            "handover_grace": 2.0,
            "connection_grace": 2.0,
            "resync_period": 30.0,
            "lease_duration": 3.0,
            "lease_renew": 1.0,
            "identity": f"agent-{len(self.running)}",
        }
        values.update(changes)
        return AgentSettings(**values)

    async def start(self, settings: AgentSettings, overrides: Overrides | None = None) -> Agent:
        agent = Agent(settings, overrides=overrides)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        self.running.append(RunningAgent(agent, stop, task))
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        return agent

    async def stop_all(self) -> None:
        while self.running:
            await self.running.pop().stop()

    # the Kyma CR and ApplicationConnector

    def put_kyma(self, *, modules: list[str], runtime_label: bool = True) -> None:
        labels = {"kyma-project.io/runtime-id": self.runtime_id} if runtime_label else {}
        body = {
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "Kyma",
            "metadata": {"name": "default", "namespace": self.namespace, "labels": labels},
            "spec": {"channel": "regular", "modules": [{"name": m} for m in modules]},
        }
        custom = self.cluster.custom
        try:
            current = custom.get_namespaced_custom_object(
                *KYMA[:2], self.namespace, KYMA[2], "default"
            )
        except ApiException as e:
            if e.status != 404:
                raise
            custom.create_namespaced_custom_object(*KYMA[:2], self.namespace, KYMA[2], body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        custom.replace_namespaced_custom_object(*KYMA[:2], self.namespace, KYMA[2], "default", body)

    def put_application_connector(self, name: str = "applicationconnector") -> None:
        body = {
            "apiVersion": "operator.kyma-project.io/v1alpha1",
            "kind": "ApplicationConnector",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {},
        }
        self.cluster.custom.create_namespaced_custom_object(*AC[:2], self.namespace, AC[2], body)

    def delete_application_connector(self, name: str = "applicationconnector") -> None:
        self.cluster.custom.delete_namespaced_custom_object(*AC[:2], self.namespace, AC[2], name)

    # the CompassConnection (cluster-scoped: one per cluster)

    def set_connection(self, state: str, error: str | None = None, *, attempt: bool = True) -> None:
        """As compass-runtime-agent writes it; `attempt` stamps lastSync (it does on every
        attempt: a new lastSync is how our agent sees that a token was tried)."""
        custom = self.cluster.custom
        try:
            custom.get_cluster_custom_object(*CC, "compass-connection")
        except ApiException as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "compass.kyma-project.io/v1alpha1",
                "kind": "CompassConnection",
                "metadata": {"name": "compass-connection"},
                "spec": {
                    "managementInfo": {
                        "connectorUrl": "https://connector.test/graphql",
                        "directorUrl": "https://director.test/graphql",
                    }
                },
            }
            custom.create_cluster_custom_object(*CC, body)
        # The published schema requires connectionStatus.certificateStatus (CRA always writes it).
        status: dict[str, Any] = {
            "connectionState": state,
            "connectionStatus": {"certificateStatus": {}, "error": error or ""},
        }
        if attempt:
            # Microseconds, unlike the real agent's seconds: two attempts in one second differ.
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            status["connectionStatus"]["lastSync"] = now
        # The published CRD has no status subresource: compass-runtime-agent updates the object.
        custom.patch_cluster_custom_object(*CC, "compass-connection", {"status": status})

    def delete_connection(self) -> None:
        with contextlib.suppress(ApiException):
            self.cluster.custom.delete_cluster_custom_object(*CC, "compass-connection")

    # the secret and events

    def secret(self) -> Any | None:
        try:
            return self.cluster.core.read_namespaced_secret(SECRET, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def secret_data(self) -> dict[str, str] | None:
        found = self.secret()
        if found is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}

    def annotate_secret(self, annotations: dict[str, str]) -> None:
        self.cluster.core.patch_namespaced_secret(
            SECRET, self.namespace, {"metadata": {"annotations": annotations}}
        )

    def events(self, reason: str | None = None) -> list[Any]:
        items = self.cluster.core.list_namespaced_event(self.namespace).items
        return [e for e in items if reason is None or e.reason == reason]


@pytest.fixture
async def agent_env(
    runtime_a: TestCluster, namespace_factory: Callable[..., str], tmp_path: Path
) -> AsyncIterator[AgentEnv]:
    namespace = namespace_factory(runtime_a)
    env = AgentEnv(
        cluster=runtime_a, namespace=namespace, workdir=tmp_path, runtime_id=f"rt-{namespace[-6:]}"
    )
    env.delete_connection()
    try:
        yield env
    finally:
        await env.stop_all()
        env.delete_connection()
