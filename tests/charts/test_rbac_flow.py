"""The charts' RBAC is exactly enough: broker and agent run as the charts' ServiceAccounts.

Each chart is rendered with `helm`, its ServiceAccount and RBAC objects are applied to the
real API servers, and the two processes authenticate with TokenRequest tokens of those
ServiceAccounts (never as admin). The full flow must succeed; with one rule taken out of
a chart's Role it must not.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devenv.clusters import Binaries, TestCluster
from tests.charts.render import apply, by_kind, render
from tests.conftest import NamespaceFactory
from tests.integration.broker.conftest import Broker, BrokerFactory, seed_runtime

SECRET = "compass-agent-configuration"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
# How long the positive flow may take, and so how long the negative one is watched.
FLOW_TIMEOUT = 20.0

Mutation = Callable[[list[dict[str, Any]]], None]


def _drop_rule(kind: str, resource: str, verb: str) -> Mutation:
    """Removes `verb` on `resource` from the chart's `kind` (Role or ClusterRole)."""

    def mutate(objects: list[dict[str, Any]]) -> None:
        (role,) = by_kind(objects, kind)
        rules = []
        for rule in role["rules"]:
            verbs = rule["verbs"]
            if resource in rule["resources"]:
                verbs = [v for v in verbs if v != verb]
            if verbs:
                rules.append({**rule, "verbs": verbs})
        assert rules != role["rules"], f"no rule grants {verb} on {resource}"
        role["rules"] = rules

    return mutate


def _kubeconfig_as(cluster: TestCluster, namespace: str, sa: str, path: Path) -> Path:
    token = cluster.service_account_token(namespace, sa, audiences=[cluster.issuer])
    path.write_text(cluster.kubeconfig_with_token(token, user=f"{namespace}:{sa}"))
    path.chmod(0o600)
    return path


@dataclass
class Flow:
    broker: Broker
    agent: subprocess.Popen[bytes]
    runtime: TestCluster
    agent_ns: str
    agent_log: Path

    def secret(self) -> dict[str, str] | None:
        try:
            found = self.runtime.core.read_namespaced_secret(SECRET, self.agent_ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}

    def wait_for_secret(self, timeout: float) -> dict[str, str] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (data := self.secret()) is not None:
                return data
            assert self.agent.poll() is None, self.agent_log.read_text()[-2000:]
            time.sleep(0.3)
        return None


@pytest.fixture
def run_flow(
    binaries: Binaries,
    control_plane: TestCluster,
    runtime_b: TestCluster,
    kcp_ns: str,
    sim: Any,
    creds_file: Path,
    namespace_factory: NamespaceFactory,
    tmp_path: Path,
) -> Iterator[Callable[..., Flow]]:
    started: list[Flow] = []

    def start(
        *, broker_change: Mutation | None = None, agent_change: Mutation | None = None
    ) -> Flow:
        # Control plane: the broker chart's identity and RBAC, in the KCP namespace.
        broker_objects = [
            obj
            for obj in render(
                binaries,
                "compass-broker",
                namespace=kcp_ns,
                values={"director.url": sim.director_url, "kcpNamespace": kcp_ns},
                include_crds=False,
            )
            if obj["kind"] in RBAC_KINDS
        ]
        if broker_change:
            broker_change(broker_objects)
        apply(control_plane, broker_objects, namespace=kcp_ns)
        broker_kubeconfig = _kubeconfig_as(
            control_plane, kcp_ns, "compass-broker", tmp_path / "broker.kubeconfig"
        )

        # Runtime: the agent chart's identity and RBAC, in the agent's namespace.
        agent_ns = namespace_factory(runtime_b)
        agent_objects = [
            obj
            for obj in render(
                binaries,
                "compass-agent",
                namespace=agent_ns,
                values={"broker.url": "http://127.0.0.1:1", "testing.anyNamespace": "true"},
            )
            if obj["kind"] in RBAC_KINDS
        ]
        if agent_change:
            agent_change(agent_objects)
        apply(runtime_b, agent_objects, namespace=agent_ns)
        agent_kubeconfig = _kubeconfig_as(
            runtime_b, agent_ns, "compass-agent", tmp_path / "agent.kubeconfig"
        )

        runtime = seed_runtime(control_plane, kcp_ns, runtime_b)
        factory = BrokerFactory(control_plane, kcp_ns, sim, creds_file)
        broker = factory(
            KUBECONFIG=str(broker_kubeconfig),
            BROKER_ALLOWED_SERVICE_ACCOUNTS=f"{agent_ns}/compass-agent",
        )

        broker_token = tmp_path / "broker-token"
        broker_token.write_text(
            runtime_b.service_account_token(agent_ns, "compass-agent", audiences=["compass-broker"])
        )
        runtime_b.custom.create_namespaced_custom_object(
            "operator.kyma-project.io",
            "v1beta2",
            agent_ns,
            "kymas",
            {
                "apiVersion": "operator.kyma-project.io/v1beta2",
                "kind": "Kyma",
                "metadata": {
                    "name": "default",
                    "labels": {"kyma-project.io/runtime-id": runtime.runtime_id},
                },
                "spec": {"channel": "regular", "modules": [{"name": "application-connector"}]},
            },
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        env.update(
            AGENT_BROKER_URL=broker.url,
            AGENT_NAMESPACE=agent_ns,
            AGENT_KUBECONFIG=str(agent_kubeconfig),
            AGENT_SA_TOKEN_FILE=str(broker_token),
            AGENT_HEALTH_ADDRESS="127.0.0.1:0",
            AGENT_IDENTITY="rbac-flow",
            AGENT_BACKOFF_BASE="0.2",
            AGENT_BACKOFF_CAP="2",
        )
        agent_log = tmp_path / "agent.log"
        with agent_log.open("wb") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "agent"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        flow = Flow(broker, agent, runtime_b, agent_ns, agent_log)
        started.append(flow)
        return flow

    try:
        yield start
    finally:
        for flow in started:
            if flow.agent.poll() is None:
                flow.agent.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    flow.agent.wait(15)
            if flow.agent.poll() is None:
                flow.agent.kill()
                flow.agent.wait(5)
            flow.broker.stop()
            flow.broker.kill()


def test_full_flow_with_exactly_the_charts_rbac(run_flow: Callable[..., Flow], sim: Any) -> None:
    flow = run_flow()
    data = flow.wait_for_secret(FLOW_TIMEOUT)
    assert data is not None, flow.agent_log.read_text()[-3000:]
    assert set(data) == {"CONNECTOR_URL", "TOKEN", "RUNTIME_ID", "TENANT"}
    (registered,) = sim.runtimes()
    assert data["RUNTIME_ID"] == registered.id
    # Nothing either process does is refused, not even a side watch it could live without.
    assert "forbidden" not in flow.agent_log.read_text().lower()
    assert not [line for line in flow.broker.lines if "forbidden" in line.lower()]


@pytest.mark.parametrize(
    ("broker_change", "agent_change"),
    [
        pytest.param(
            None, _drop_rule("Role", "secrets", "create"), id="agent-cannot-create-secret"
        ),
        pytest.param(
            _drop_rule("Role", "compassmanagermappings", "create"),
            None,
            id="broker-cannot-create-mapping",
        ),
    ],
)
def test_flow_fails_without_one_rule(
    run_flow: Callable[..., Flow],
    sim: Any,
    broker_change: Mutation | None,
    agent_change: Mutation | None,
) -> None:
    flow = run_flow(broker_change=broker_change, agent_change=agent_change)
    assert flow.wait_for_secret(FLOW_TIMEOUT) is None
    if broker_change is not None:
        # Without a mapping the broker must not register at all: exactly-once needs the record.
        assert sim.runtimes() == []
