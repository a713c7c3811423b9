"""The broker as real pods (issue 41, item 4): `helm install charts/compass-broker` on the cluster
with a real node, from the project's image (devenv/image.py, imported with ctr).

The node's cluster is the control plane here (Kyma CRs, kubeconfig Secrets, mappings, the Lease)
and also every runtime: each seeded runtime's kubeconfig Secret names this same API server, so the
broker pods verify agents' tokens by TokenReview on it at its address on the bridge (10.77.0.1),
as they reach any runtime's API server: by the address in its kubeconfig. Director is the Compass
simulator on the same host address, where pods reach it. The fleets run on the host and reach the
Service's ClusterIP through kube-proxy's rules, as pods do.

- Two replicas Ready by their probes, the Service's endpoints, the PodDisruptionBudget allowing
  one disruption, one Lease holder; the agent's chart as a pod, pointed at the Service's address
  (pods have no DNS here), gets its token through it.
- A cold start of a fleet through the Service: the Lease holder's pod deleted once a quarter of
  the runtimes are registered -> the other replica takes the Lease, every runtime connects, one
  registration each in the simulator's store.
- `helm upgrade` with a changed setting rolls both pods while agents report through the Service
  without pause: every request answered, none refused or reset.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.broker_client import BrokerClient
from agent.outcomes import Accepted, Issued, ReportOutcome
from agent.retry_policy import DEFAULT_POLICY
from bench.fleet import Agent, FleetProcesses, FleetResult, StaticIdentity, outcome_label
from bench.scenarios import connection_report
from devenv.clusters import Binaries, TestCluster
from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.faults import Latency
from devenv.node import HOST_IP, NodeCluster
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import (
    AGENT_NS,
    AGENT_SA,
    AUDIENCE,
    CLIENT_ID,
    CLIENT_SECRET,
    MAPPING_CRD,
    Runtime,
    seed_runtime,
)
from tests.integration.node.conftest import (
    NodeSlot,
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

pytestmark = pytest.mark.timeout(900)

CHART = REPO_ROOT / "charts" / "compass-broker"
AGENT_CHART = REPO_ROOT / "charts" / "compass-agent"
RELEASE = "compass-broker"
LEASE = "compass-broker-leader"
SELECTOR = "app.kubernetes.io/name=compass-broker"
COLD_START = 40  # runtimes; with Director at 1 s a call the cold start lasts well past a pod's end
REPORTING_AGENTS = 8
NEWCOMERS = 10  # runtimes asking for their first token during a rollout, one every 2 s


@dataclass
class Release:
    node: NodeCluster
    namespace: str
    sim: CompassSimulator
    binaries: Binaries
    image: str
    values: list[str] = field(default_factory=list)

    @property
    def cluster(self) -> TestCluster:
        return self.node.cluster

    @property
    def service_url(self) -> str:
        service = self.cluster.core.read_namespaced_service(RELEASE, self.namespace)
        return f"http://{service.spec.cluster_ip}:{service.spec.ports[0].port}"

    def pods(self, *, terminating: bool = False) -> list[Any]:
        found = self.cluster.core.list_namespaced_pod(self.namespace, label_selector=SELECTOR)
        return [p for p in found.items if terminating or p.metadata.deletion_timestamp is None]

    def ready_pods(self) -> list[str]:
        return [
            p.metadata.name
            for p in self.pods()
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]

    def lease_holder(self) -> str | None:
        """The pod whose broker holds the Lease (a broker's identity starts with its host name,
        which in a pod is the pod's name)."""
        coordination = client.CoordinationV1Api(self.cluster.api_client)
        try:
            lease = coordination.read_namespaced_lease(LEASE, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        holder = lease.spec.holder_identity or ""
        return next((p for p in self.ready_pods() if holder.startswith(f"{p}-")), None)

    def seed(self) -> Runtime:
        return seed_runtime(self.cluster, self.namespace, self.cluster)

    def token(self) -> str:
        return self.cluster.service_account_token(
            AGENT_NS, AGENT_SA, audiences=[AUDIENCE], expiration_seconds=3600
        )

    def logs(self) -> str:
        return pod_logs(self.cluster, self.namespace, self.pods())


@pytest.fixture(scope="module")
def release(node_slot: NodeSlot, binaries: Binaries, tmp_path_factory: Any) -> Iterator[Release]:
    node = node_slot.shared()
    name = project_image(node)
    cluster = node.cluster
    cluster.apply_crds(sorted(MAPPING_CRD.glob("*.yaml")))
    namespace = cluster.create_namespace(f"kcp-{uuid.uuid4().hex[:8]}")
    sim = CompassSimulator(SimConfig(client_id=CLIENT_ID, client_secret=CLIENT_SECRET))
    sim.start(HOST_IP, port=0)
    credentials = (
        f"data:\n  client_id: {CLIENT_ID}\n  client_secret: {CLIENT_SECRET}\n"
        f"  tokens_endpoint: {sim.token_url}\n"
    )
    cluster.core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="compass-manager-credentials"),
            string_data={"credentials.yaml": credentials},
        ),
    )
    state = Release(node, namespace, sim, binaries, name)
    state.values = [
        *image_values(name),
        "--set",
        f"director.url={sim.director_url}",
        "--set",
        f"kcpNamespace={namespace}",
        # Agents here report far more often than the 10 s a runtime's reports are allowed, so
        # that a rollout meets a steady stream of requests from a handful of them.
        "--set",
        "extraEnv[0].name=BROKER_REPORT_MIN_INTERVAL_SECONDS",
        "--set-string",
        "extraEnv[0].value=0.1",
    ]
    started = time.monotonic()
    helm(
        binaries,
        node,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        *state.values,
        "--wait",
        "--timeout",
        "180s",
        timeout=200,
    )
    print(f"broker release Available {time.monotonic() - started:.1f}s after helm install")
    try:
        yield state
    finally:
        helm(binaries, node, "uninstall", RELEASE, "--namespace", namespace, "--wait")
        sim.stop()


def test_two_broker_pods_serve_agents_through_their_service(
    release: Release, binaries: Binaries
) -> None:
    apps = client.AppsV1Api(release.cluster.api_client)
    assert deployment_condition(apps, release.namespace, RELEASE) == "True"
    pods = release.pods()
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod.spec.containers
        assert container.readiness_probe.http_get.path == "/readyz"
        assert container.liveness_probe.http_get.path == "/healthz"
    assert sorted(release.ready_pods()) == sorted(p.metadata.name for p in pods)
    endpoints = release.cluster.core.read_namespaced_endpoints(RELEASE, release.namespace)
    assert sorted(a.ip for s in endpoints.subsets for a in s.addresses) == sorted(
        p.status.pod_ip for p in pods
    )
    policy = client.PolicyV1Api(release.cluster.api_client)
    budget = wait_until(
        lambda: (
            b
            if (
                b := policy.read_namespaced_pod_disruption_budget(RELEASE, release.namespace)
            ).status.current_healthy
            == 2
            else None
        ),
        within=30,
        what="the PodDisruptionBudget's status",
    )
    assert budget.status.disruptions_allowed == 1
    wait_until(release.lease_holder, within=30, what="a Lease holder among the pods")

    # The agent's chart as a pod of the same cluster, its broker the Service's address.
    runtime = release.seed()
    release.cluster.core.delete_namespaced_service_account(AGENT_SA, AGENT_NS)
    helm(
        binaries,
        release.node,
        "install",
        "compass-agent",
        str(AGENT_CHART),
        "--namespace",
        AGENT_NS,
        *image_values(release.image),
        "--set",
        f"broker.url={release.service_url}",
        "--set",
        f"runtimeID={runtime.runtime_id}",
        "--set",
        "backoffCapSeconds=4",
    )
    try:
        enable_module(release.cluster, runtime.runtime_id)
        data = wait_until(
            lambda: token_secret(release.cluster),
            within=120,
            what="the agent pod's token through the Service\n" + release.logs(),
        )
        assert data["TENANT"] == runtime.tenant
        assert [r.id for r in release.sim.runtimes(runtime.tenant)] == [data["RUNTIME_ID"]]
    finally:
        helm(binaries, release.node, "uninstall", "compass-agent", "-n", AGENT_NS, "--wait")
        remove_module_state(release.cluster)


def test_the_lease_holders_pod_deleted_mid_cold_start_is_taken_over_without_duplicates(
    release: Release, tmp_path: Path
) -> None:
    runtimes = [release.seed() for _ in range(COLD_START)]
    token = release.token()
    agents = [Agent(runtime_id=r.runtime_id, token=token) for r in runtimes]
    tenants = {r.tenant for r in runtimes}
    holder = wait_until(release.lease_holder, within=30, what="a Lease holder")
    release.sim.update_faults(latency=Latency(fixed_seconds=1.0))

    def registered() -> dict[str, int]:
        """Director runtimes by tenant (a runtime is kept under its subaccount, seen by its
        global account too)."""
        return {t: n for t in tenants if (n := len(release.sim.runtimes(t)))}

    async def cold_start() -> FleetResult:
        result = FleetResult(started_at=0.0)
        fleet = FleetProcesses(
            brokers=[release.service_url],
            agents=agents,
            processes=1,
            workdir=tmp_path,
            env=dict(os.environ),
            deadline_seconds=240,
        )
        await fleet.start()
        run = asyncio.create_task(fleet.run(result))
        while len(registered()) < COLD_START // 4:
            if run.done():
                run.result()  # what ended it, if it raised
                pytest.fail(
                    "the cold start ended before a quarter was registered: "
                    f"{dict(result.attempts)} {list(result.refused.values())[:3]}"
                )
            await asyncio.sleep(0.1)
        release.cluster.core.delete_namespaced_pod(holder, release.namespace)
        return await run

    try:
        result = asyncio.run(cold_start())
    finally:
        release.sim.clear_faults()
    taken_over = wait_until(
        lambda: (h := release.lease_holder()) not in (None, holder) and h,
        within=30,
        what="the other replica holding the Lease",
    )
    print(f"cold start of {COLD_START}: {dict(result.attempts)}; Lease {holder} -> {taken_over}")
    assert result.connected == COLD_START, (result.refused, result.attempts, release.logs())
    assert registered() == dict.fromkeys(tenants, 1), "duplicate registrations"
    wait_until(lambda: len(release.ready_pods()) == 2, within=60, what="the successor Ready")


def report_label(answer: ReportOutcome) -> str:
    if isinstance(answer, Accepted):
        return "202"
    return f"{answer.status} {answer.reason}" if answer.status else answer.reason


def test_helm_upgrade_rolls_the_pods_without_a_failed_agent_request(release: Release) -> None:
    runtimes = [release.seed() for _ in range(REPORTING_AGENTS)]
    newcomers = [release.seed() for _ in range(NEWCOMERS)]
    token = release.token()
    before = {p.metadata.name for p in release.pods()}
    outcomes: Counter[str] = Counter()  # reports
    pulls: Counter[str] = Counter()  # the newcomers' token requests, each attempt

    def client() -> BrokerClient:
        return BrokerClient(
            base_url=release.service_url,
            identity=StaticIdentity(token),
            policy=DEFAULT_POLICY,
            timeout=30,
            clock=lambda: datetime.now(UTC),
        )

    async def agent(runtime: Runtime, rolled: asyncio.Event) -> None:
        broker = client()
        try:
            assert isinstance(await broker.pull(runtime.runtime_id), Issued)
            body = json.dumps(connection_report(token)).encode()
            while not rolled.is_set():
                answer = await broker.report(runtime.runtime_id, body)
                outcomes[report_label(answer)] += 1
                await asyncio.sleep(0.2)
        finally:
            await broker.aclose()

    async def newcomer(runtime: Runtime, after: float) -> None:
        """A runtime whose module is enabled during the rollout: registered and given a token."""
        await asyncio.sleep(after)
        broker = client()
        try:
            outcome = await broker.pull(
                runtime.runtime_id, on_attempt=lambda o: pulls.update([outcome_label(o)])
            )
            assert isinstance(outcome, Issued), outcome
        finally:
            await broker.aclose()

    async def upgrade() -> float:
        rolled = asyncio.Event()
        reporting = [asyncio.create_task(agent(r, rolled)) for r in runtimes]
        await asyncio.sleep(3)
        joining = [asyncio.create_task(newcomer(r, after=2.0 * i)) for i, r in enumerate(newcomers)]
        started = time.monotonic()
        await asyncio.to_thread(
            helm,
            release.binaries,
            release.node,
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            release.namespace,
            *release.values,
            "--set",
            "logLevel=DEBUG",
            "--wait",
            "--timeout",
            "180s",
            timeout=200,
        )
        took = time.monotonic() - started
        # Until the old pods are gone, not only terminating: their ends are what counts.
        await asyncio.to_thread(
            wait_until,
            lambda: (
                not ({p.metadata.name for p in release.pods(terminating=True)} & before)
                and len(release.ready_pods()) == 2
            ),
            within=90,
            what="the old pods gone",
        )
        await asyncio.sleep(2)
        rolled.set()
        await asyncio.gather(*reporting, *joining)
        return took

    took = asyncio.run(upgrade())
    print(
        f"helm upgrade rolled in {took:.1f}s; agents' reports: {dict(outcomes)}; "
        f"newcomers' token requests: {dict(pulls)}"
    )
    assert outcomes["202"] > 10 * REPORTING_AGENTS
    failed = {k: v for k, v in outcomes.items() if k != "202"}
    assert not failed, (outcomes, release.logs())
    # Every attempt answered by a broker (a 503 with Retry-After is an answer); none lost.
    assert pulls["201"] == NEWCOMERS
    assert not [k for k in pulls if k.startswith("transport")], pulls
