"""Kyma's real compass-runtime-agent against our agent and the simulated Compass.

Everything runs on a cluster of its own: the CompassConnection is cluster-scoped and has a fixed
name, and the real agent's namespace is `kyma-system`. The binary comes from
`devenv/runtime_agent/build.sh` (run by `make test` before pytest); without its source the tests
skip and say why.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from devenv import runtime_agent
from devenv.clusters import Binaries, TestCluster, kyma_crds, start_cluster
from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.mtls import CertificateSecuredCompass
from devenv.compass_sim.testing import REQUEST_ONE_TIME_TOKEN, DirectorClient
from tests.integration.agent.conftest import AgentEnv, FakeBroker, Reply

TENANT = "global-account-1"
OTT = "requestOneTimeTokenForRuntime"


@pytest.fixture(scope="session")
def runtime_agent_dir() -> Path:
    try:
        return runtime_agent.build()
    except runtime_agent.RuntimeAgentUnavailable as e:
        if e.source_missing:
            pytest.skip(f"the real compass-runtime-agent cannot be built here: {e.reason}")
        raise


@pytest.fixture(scope="module")
def own_cluster(
    binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    cluster = start_cluster("real-cra", binaries, workdir=tmp_path_factory.mktemp("real-cra"))
    try:
        cluster.apply_crds(kyma_crds())
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Landscape:
    sim: CompassSimulator
    secured: CertificateSecuredCompass
    compass_runtime_id: str
    broker: FakeBroker
    env: AgentEnv

    def tokens_issued(self) -> int:
        return self.sim.counter(OTT).successes

    def connection(self) -> dict[str, Any] | None:
        try:
            found = self.env.cluster.custom.get_cluster_custom_object(
                "compass.kyma-project.io", "v1alpha1", "compassconnections", "compass-connection"
            )
        except ApiException:  # absent: no state yet
            return None
        return found if isinstance(found, dict) else None

    def state(self) -> str | None:
        found = self.connection()
        return (found or {}).get("status", {}).get("connectionState")

    def reported_states(self) -> list[str]:
        return [body.get("connectionState", "") for body in self.broker.report_bodies]


@pytest.fixture
async def landscape(own_cluster: TestCluster, tmp_path: Path) -> AsyncIterator[Landscape]:
    sim = CompassSimulator(SimConfig(client_id="id", client_secret="secret"))
    sim.start()
    secured = CertificateSecuredCompass(sim).start()
    runtime = sim.seed_runtime(tenant=TENANT, name="real-cra-runtime")
    director = DirectorClient(
        httpx.Client(timeout=10), sim.director_url, token=sim.issue_access_token(), tenant=TENANT
    )

    def issue(_: int) -> Reply:
        # Every pull costs one Director call, as with the real broker.
        ott = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime.id})
        expires = datetime.now(UTC) + timedelta(minutes=60)
        return Reply(
            201,
            {
                "token": ott["token"],
                "connectorURL": ott["connectorURL"],
                "compassRuntimeID": runtime.id,
                "tenant": TENANT,
                "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        )

    broker = FakeBroker(issue)
    await broker.start()
    own_cluster.create_namespace(runtime_agent.AGENT_NAMESPACE)
    env = AgentEnv(
        cluster=own_cluster,
        namespace=runtime_agent.AGENT_NAMESPACE,
        workdir=tmp_path,
        runtime_id=f"kyma-{re.sub(r'[^a-z0-9]', '', tmp_path.name)[-8:]}",
    )
    env.delete_connection()
    try:
        yield Landscape(sim, secured, runtime.id, broker, env)
    finally:
        await env.stop_all()
        await broker.stop()
        director.client.close()
        secured.stop()
        sim.stop()
        env.delete_connection()
        for name in ("compass-agent-configuration", "cluster-client-certificates"):
            _delete_secret(own_cluster, runtime_agent.AGENT_NAMESPACE, name)


def _delete_secret(cluster: TestCluster, namespace: str, name: str) -> None:
    with contextlib.suppress(ApiException):  # already gone
        cluster.core.delete_namespaced_secret(name, namespace)
