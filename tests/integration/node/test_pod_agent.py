"""The agent as a real pod (issue 41, item 3): `helm install charts/compass-agent` on a runtime
cluster with a real node, from the project's image (devenv/image.py, imported with ctr).

The broker runs as a local process, as the other integration tests start it, in `tokenreview`
identity mode: it verifies the agent's kubelet-projected token (audience compass-broker) with a
TokenReview on the node cluster's API server, through the kubeconfig Secret seeded in the
control plane. It listens on the pod bridge's host address, where the pod reaches it.

- The module enabled on the runtime's Kyma -> the pod proves itself -> the broker verifies it and
  registers the runtime -> kyma-system/compass-agent-configuration is written -> the Deployment
  is Available.
- The pod deleted in the middle of its pull (Director slow) -> its successor, made by the
  ReplicaSet, finishes: one registration, at most one extra token.
- Readiness follows the broker: the broker stopped, then the module enabled (the agent must pull)
  -> the Deployment Available=False; the broker back on the same address -> Available=True, and
  the secret written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from devenv.clusters import Binaries, TestCluster, free_port
from devenv.compass_sim.faults import Latency
from devenv.node import HOST_IP, NodeCluster
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import (
    AGENT_NS,
    AGENT_SA,
    Broker,
    BrokerFactory,
    Runtime,
    seed_runtime,
)
from tests.integration.node.conftest import (
    deployment_condition,
    enable_module,
    helm,
    image_values,
    pod_logs,
    project_image,
    remove_module_state,
    token_secret,
)
from tests.integration.waiting import wait_until

# Outside make test (which builds the image first) a changed tree builds it here: minutes.
pytestmark = pytest.mark.timeout(900)

CHART = REPO_ROOT / "charts" / "compass-agent"
RELEASE = "compass-agent"


@pytest.fixture
def agent_image(node_cluster: NodeCluster) -> str:
    return project_image(node_cluster)


@dataclass
class NodeBroker(Broker):
    """The broker on the bridge's host address (pods reach it there), on a port it keeps when
    started again."""

    @property
    def url(self) -> str:
        return f"http://{HOST_IP}:{self.port}"


@dataclass
class Installed:
    node: NodeCluster
    runtime: Runtime
    broker: NodeBroker

    @property
    def cluster(self) -> TestCluster:
        return self.node.cluster

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.cluster.api_client)

    def available(self) -> str | None:
        return deployment_condition(self.apps, AGENT_NS, RELEASE)

    def secret(self) -> dict[str, str] | None:
        return token_secret(self.cluster)

    def pods(self) -> list[Any]:
        return list(
            self.cluster.core.list_namespaced_pod(
                AGENT_NS, label_selector="app.kubernetes.io/name=compass-agent"
            ).items
        )

    def enable_module(self) -> None:
        enable_module(self.cluster, self.runtime.runtime_id)

    def agent_logs(self) -> str:
        return pod_logs(self.cluster, AGENT_NS, self.pods())


@pytest.fixture
def installed(
    binaries: Binaries,
    node_cluster: NodeCluster,
    agent_image: str,
    control_plane: TestCluster,
    kcp_ns: str,
    brokers: BrokerFactory,
) -> Iterator[Installed]:
    cluster = node_cluster.cluster
    cluster.create_namespace(AGENT_NS)
    runtime = seed_runtime(control_plane, kcp_ns, cluster)
    # seed_runtime makes the agent's ServiceAccount for process-level tests; here the chart does.
    cluster.core.delete_namespaced_service_account(AGENT_SA, AGENT_NS)
    broker = NodeBroker(
        env=brokers.env(
            BROKER_HOST=HOST_IP,
            BROKER_PORT=str(free_port()),
            BROKER_IDENTITY_MODE="tokenreview",
            BROKER_DIRECTOR_TIMEOUT_SECONDS="10",
        )
    )
    brokers.started.append(broker)
    helm(
        binaries,
        node_cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        AGENT_NS,
        *image_values(agent_image),
        "--set",
        f"broker.url=http://{HOST_IP}:{broker.env['BROKER_PORT']}",
        "--set",
        f"runtimeID={runtime.runtime_id}",
        "--set",
        "backoffCapSeconds=4",
        "--wait=false",
    )
    state = Installed(node_cluster, runtime, broker)
    try:
        yield state
    finally:
        helm(binaries, node_cluster, "uninstall", RELEASE, "--namespace", AGENT_NS, "--wait")
        remove_module_state(cluster)


def test_the_agent_pod_connects_with_its_projected_token_and_readiness_follows_the_broker(
    installed: Installed, sim: Any
) -> None:
    started = time.monotonic()
    installed.broker.start()
    wait_until(lambda: installed.available() == "True", within=90, what="the agent Available")
    print(f"agent Deployment Available {time.monotonic() - started:.1f}s after helm install")

    # The broker stopped, then the module enabled: the agent must pull and gets no answer.
    installed.broker.stop()
    installed.enable_module()
    wait_until(
        lambda: installed.available() == "False",
        within=60,
        what="Available=False while the broker does not answer",
    )
    assert installed.secret() is None

    # The broker back on the address the chart names: the projected token passes its
    # TokenReview on the node cluster, the runtime is registered, the secret written.
    installed.broker.start()
    data = wait_until(installed.secret, within=60, what="compass-agent-configuration")
    assert set(data) == {"CONNECTOR_URL", "TOKEN", "RUNTIME_ID", "TENANT"}
    assert data["TENANT"] == installed.runtime.tenant
    assert [r.id for r in sim.runtimes(installed.runtime.tenant)] == [data["RUNTIME_ID"]]
    wait_until(
        lambda: installed.available() == "True", within=60, what="Available again with the broker"
    )
    issued = [e for e in installed.broker.logs() if e.get("msg") == "token issued"]
    assert [e["kyma"] for e in issued] == [installed.runtime.kyma_name]
    assert installed.runtime.mapping() is not None


def test_a_pod_deleted_mid_pull_is_succeeded_without_a_second_registration(
    installed: Installed, sim: Any
) -> None:
    installed.broker.start()
    wait_until(lambda: installed.available() == "True", within=90, what="the agent Available")
    (first,) = installed.pods()
    # Director slow: the pull is still going on when its pod goes.
    sim.update_faults(latency=Latency(fixed_seconds=3.0))
    installed.enable_module()
    tenant = installed.runtime.tenant
    wait_until(
        lambda: sim.request_log(tenant=tenant),
        within=60,
        what="the broker at Director",
        interval=0.1,
    )
    assert installed.secret() is None
    installed.cluster.core.delete_namespaced_pod(first.metadata.name, AGENT_NS)

    data = wait_until(installed.secret, within=90, what="the successor's secret")
    successors = [p for p in installed.pods() if p.metadata.name != first.metadata.name]
    assert successors, "no successor pod"
    wait_until(lambda: installed.available() == "True", within=60, what="Available again")
    sim.clear_faults()
    assert [r.id for r in sim.runtimes(tenant)] == [data["RUNTIME_ID"]]
    tokens = sim.connector_tokens(data["RUNTIME_ID"])
    assert 1 <= len(tokens) <= 2, tokens
