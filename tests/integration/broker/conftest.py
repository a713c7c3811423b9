"""Helpers for the broker's integration tests: real API servers (control plane + two runtimes),
the Compass simulator, and the broker itself running as a separate process.

Each test gets its own KCP namespace (the broker's `BROKER_KCP_NAMESPACE`), a fresh simulator
and fresh runtime IDs, so tests never see each other's Kymas, mappings or Director runtimes.
The broker's stderr (JSON log lines) is captured for assertions such as "no token in any log".
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv.clusters import TestCluster
from devenv.compass_sim import CompassSimulator, SimConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
MAPPING_CRD = REPO_ROOT / "charts" / "compass-broker" / "crds"
AUDIENCE = "compass-broker"
AGENT_NS, AGENT_SA = "kyma-system", "compass-agent"
CLIENT_ID, CLIENT_SECRET = "broker-client", "broker-client-secret-value"
GROUP = "operator.kyma-project.io"


@pytest.fixture(scope="session")
def broker_crds(control_plane: TestCluster) -> TestCluster:
    control_plane.apply_crds(sorted(MAPPING_CRD.glob("*.yaml")))
    return control_plane


@pytest.fixture
def kcp_ns(broker_crds: TestCluster, namespace_factory: Any) -> str:
    ns: str = namespace_factory(broker_crds)
    return ns


@pytest.fixture
def sim() -> Iterator[Any]:
    simulator = CompassSimulator(SimConfig(client_id=CLIENT_ID, client_secret=CLIENT_SECRET))
    simulator.start("127.0.0.1", port=0)
    try:
        yield simulator
    finally:
        simulator.stop()


@pytest.fixture
def creds_file(sim: Any, tmp_path: Path) -> Path:
    path = tmp_path / "director-credentials.yaml"
    path.write_text(
        "data:\n"
        f"  client_id: {CLIENT_ID}\n"
        f"  client_secret: {CLIENT_SECRET}\n"
        f"  tokens_endpoint: {sim.token_url}\n"
    )
    return path


# --- seeding the control plane ---------------------------------------------------------------


@dataclass
class Runtime:
    runtime_id: str
    tenant: str
    cluster: TestCluster
    kcp: TestCluster
    namespace: str

    @property
    def kyma_name(self) -> str:
        return self.runtime_id.lower()

    def token(
        self,
        *,
        audience: str = AUDIENCE,
        sa: str = AGENT_SA,
        ns: str = AGENT_NS,
        seconds: int = 600,
    ) -> str:
        return self.cluster.service_account_token(
            ns, sa, audiences=[audience], expiration_seconds=seconds
        )

    def kyma(self) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.kcp.custom.get_namespaced_custom_object(
                GROUP, "v1beta2", self.namespace, "kymas", self.kyma_name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def patch_kyma(self, body: dict[str, Any]) -> None:
        self.kcp.custom.patch_namespaced_custom_object(
            GROUP, "v1beta2", self.namespace, "kymas", self.kyma_name, body
        )

    def delete_kyma(self) -> None:
        self.kcp.custom.delete_namespaced_custom_object(
            GROUP, "v1beta2", self.namespace, "kymas", self.kyma_name
        )

    def mapping(self) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.kcp.custom.get_namespaced_custom_object(
                GROUP, "v1beta1", self.namespace, "compassmanagermappings", self.kyma_name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj


def seed_runtime(
    kcp: TestCluster,
    namespace: str,
    runtime_cluster: TestCluster,
    *,
    modules: tuple[str, ...] = ("application-connector",),
    shoot: str | None = None,
    runtime_id: str | None = None,
) -> Runtime:
    """Seeds a Kyma CR and the runtime kubeconfig Secret in KCP, the agent SA in the runtime."""
    runtime_id = runtime_id or str(uuid.uuid4()).upper()
    tenant = f"ga-{uuid.uuid4().hex[:8]}"
    name = runtime_id.lower()
    labels = {
        "kyma-project.io/runtime-id": runtime_id,
        "kyma-project.io/global-account-id": tenant,
        "kyma-project.io/subaccount-id": f"sa-{uuid.uuid4().hex[:8]}",
        "kyma-project.io/shoot-name": shoot or f"c-{uuid.uuid4().hex[:7]}",
        "kyma-project.io/instance-id": f"inst-{uuid.uuid4().hex[:8]}",
        "kyma-project.io/broker-plan-id": "plan-id",
        "kyma-project.io/broker-plan-name": "azure",
        "kyma-project.io/region": "westeurope",
        "operator.kyma-project.io/kyma-name": name,
    }
    kcp.custom.create_namespaced_custom_object(
        GROUP,
        "v1beta2",
        namespace,
        "kymas",
        {
            "apiVersion": f"{GROUP}/v1beta2",
            "kind": "Kyma",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"channel": "regular", "modules": [{"name": m} for m in modules]},
        },
    )
    kcp.core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=f"kubeconfig-{runtime_id}".lower(),
                labels={"operator.kyma-project.io/kyma-name": name},
            ),
            data={"config": base64.b64encode(runtime_cluster.kubeconfig_text.encode()).decode()},
        ),
    )
    runtime_cluster.ensure_service_account(AGENT_NS, AGENT_SA)
    return Runtime(runtime_id, tenant, runtime_cluster, kcp, namespace)


# --- the broker process ------------------------------------------------------------------------


CRASH_AFTER_REGISTER = "TEST_BROKER_CRASH_AFTER_REGISTER"


@dataclass
class Broker:
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)
    port: int = 0
    _reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait_ready: bool = True, timeout: float = 30.0) -> Broker:
        self.port = 0
        # A broker that must crash between registering and recording runs the test-only
        # entry point (tests/integration/broker/crashing_broker.py); the real one otherwise.
        module = (
            "tests.integration.broker.crashing_broker"
            if self.env.get(CRASH_AFTER_REGISTER)
            else "control_plane_broker"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        listening = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.lines.append(line.rstrip("\n"))
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("msg") == "listening":
                        self.port = int(entry["port"])
                        listening.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not listening.wait(timeout):
            self.kill()
            raise AssertionError("broker did not start:\n" + "\n".join(self.lines[-30:]))
        if wait_ready:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                        return self
                time.sleep(0.1)
            raise AssertionError("broker not ready:\n" + "\n".join(self.lines[-30:]))
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._close()
        return code

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait_exit(20)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def request_token(
        self,
        runtime_id: str,
        token: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> httpx.Response:
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        return httpx.post(f"{self.url}/v1/runtimes/{runtime_id}/token", headers=h, timeout=timeout)

    def report_connection(
        self,
        runtime_id: str,
        token: str | None = None,
        *,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> httpx.Response:
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        return httpx.post(
            f"{self.url}/v1/runtimes/{runtime_id}/connection", json=body, headers=h, timeout=timeout
        )

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def gauge(self, name: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def writes_settled(self) -> None:
        """Waits until the KCP writes no answer waits for (the mapping's status after a token
        or a failure, Events) are written: they wait while Director is busy."""
        wait_for(
            lambda: self.gauge("broker_deferred_writes_pending") == 0,
            what="the broker's deferred writes written",
        )

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


@dataclass
class BrokerFactory:
    kcp: TestCluster
    namespace: str
    sim: Any
    creds: Path
    started: list[Broker] = field(default_factory=list)

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
        env.update(
            {
                "KUBECONFIG": str(self.kcp.kubeconfig_path),
                "BROKER_DIRECTOR_URL": self.sim.director_url,
                "BROKER_DIRECTOR_CREDENTIALS_FILE": str(self.creds),
                "BROKER_KCP_NAMESPACE": self.namespace,
                "BROKER_LEASE_NAMESPACE": self.namespace,
                "BROKER_HOST": "127.0.0.1",
                "BROKER_PORT": "0",
                "BROKER_AUDIENCE": AUDIENCE,
                "BROKER_LEASE_DURATION_SECONDS": "3",
                "BROKER_LEASE_RENEW_SECONDS": "0.5",
                "BROKER_SWEEP_INTERVAL_SECONDS": "2",
                "BROKER_DIRECTOR_TIMEOUT_SECONDS": "3",
                "BROKER_RETRY_AFTER_JITTER_SECONDS": "2",
                "BROKER_LOG_LEVEL": "DEBUG",
            }
        )
        env.update(overrides)
        return env

    def __call__(self, *, start: bool = True, **overrides: str) -> Broker:
        broker = Broker(env=self.env(**overrides))
        self.started.append(broker)
        if start:
            broker.start()
        return broker


@pytest.fixture
def brokers(
    control_plane: TestCluster, kcp_ns: str, sim: Any, creds_file: Path
) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(control_plane, kcp_ns, sim, creds_file)
    try:
        yield factory
    finally:
        for broker in factory.started:
            broker.stop()
            broker.kill()


def wait_for(
    predicate: Any, *, timeout: float = 20.0, interval: float = 0.2, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
