"""The real lifecycle-manager around the agent: one KCP with KLM and the registry per test
module, one fresh runtime (its own API server) per test, since KLM owns `kyma-system/default`
there and a runtime has one Kyma."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.process import Agent
from devenv import klm
from devenv import kyma_module as km
from devenv.clusters import Binaries, TestCluster, start_cluster
from tests.integration.agent.conftest import AgentEnv, FakeBroker, Pki, token_reply

CONFIG = km.load_config()
MODULE = CONFIG.short_name
# The agent's own CRDs on the runtime; KLM installs the Kyma and module catalog ones itself.
RUNTIME_CRDS = [
    km.REPO_ROOT / "devenv" / "crds" / "compass.kyma-project.io_compassconnections.yaml",
    km.REPO_ROOT / "devenv" / "crds" / "operator.kyma-project.io_applicationconnectors.yaml",
]


@pytest.fixture(scope="module")
def klm_build() -> klm.KlmBuild:
    try:
        return klm.find_klm()
    except klm.KlmUnavailable as e:
        pytest.skip(f"real lifecycle-manager: {e}")


@pytest.fixture(scope="module")
def module_files(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make module` writes, made the same way."""
    out = tmp_path_factory.mktemp("module")
    km.build(binaries.helm, out)
    return out


@dataclass
class Kcp:
    landscape: klm.Landscape
    module_files: Path

    @property
    def cluster(self) -> TestCluster:
        return self.landscape.kcp

    def template(self) -> dict[str, Any]:
        return klm_yaml(self.module_files / f"moduletemplate-{CONFIG.template_name}.yaml")

    def release_meta(self) -> dict[str, Any]:
        return klm_yaml(self.module_files / "module-release-meta.yaml")

    def publish(
        self,
        *,
        template: dict[str, Any] | None = None,
        release_meta: dict[str, Any] | None = None,
        version: str = CONFIG.version,
        resource: str = "raw-manifest",
    ) -> None:
        """The module as the landscape's pipeline publishes it: the OCM component from
        module-config.yaml's name and version (what modulectl reads) with the raw manifest,
        then `make module`'s ModuleTemplate and ModuleReleaseMeta, unchanged. The arguments
        publish it wrong."""
        self.landscape.registry.push(
            component=CONFIG.name,
            version=version,
            manifest=self.module_files / km.MANIFEST_FILE,
            resource=resource,
        )
        klm.apply_module(
            self.cluster, [template or self.template(), release_meta or self.release_meta()]
        )


def klm_yaml(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = km.yaml.safe_load(path.read_text())
    return loaded


@pytest.fixture(scope="module")
def kcp(
    klm_build: klm.KlmBuild,
    binaries: Binaries,
    module_files: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Kcp]:
    workdir = tmp_path_factory.mktemp("klm-kcp")
    cluster = start_cluster("klm-kcp", binaries, workdir=workdir / "cluster")
    try:
        with klm.running(klm_build, cluster, workdir) as landscape:
            published = Kcp(landscape, module_files)
            published.publish()
            yield published
    finally:
        cluster.stop()


@dataclass
class Runtime:
    """One runtime KLM manages, with the agent's broker and, once started, the agent."""

    kcp: Kcp
    cluster: TestCluster
    kyma: str
    runtime_id: str
    env: AgentEnv
    broker: FakeBroker
    ca_bundle: Path
    stand_in: klm.RolloutStandIn
    agent: Agent | None = None

    def kcp_kyma(self) -> dict[str, Any] | None:
        return klm.kcp_kyma(self.kcp.cluster, self.kyma)

    def module_state(self) -> str | None:
        status = klm.module_status(self.kcp_kyma(), MODULE)
        return None if status is None else status.get("state")

    def kyma_state(self) -> str | None:
        return ((self.kcp_kyma() or {}).get("status") or {}).get("state")

    def agent_ready(self) -> bool:
        """The agent's own /readyz: what a kubelet's readiness probe would ask. Called from the
        stand-in's thread, never from the event loop the agent serves on."""
        if self.agent is None:
            return False
        response = httpx.get(f"http://127.0.0.1:{self.agent.health.port}/readyz", timeout=2)
        return response.status_code == 200


@pytest.fixture
async def runtime(kcp: Kcp, binaries: Binaries, tmp_path: Path) -> AsyncIterator[Runtime]:
    suffix = uuid.uuid4().hex[:6]
    cluster = start_cluster(f"skr-{suffix}", binaries, workdir=tmp_path / "cluster")
    try:
        cluster.apply_crds(RUNTIME_CRDS)
        server_ca = Pki("broker-ca")
        server_ca.issue("127.0.0.1", server=True).write(tmp_path / "srv.crt", tmp_path / "srv.key")
        (tmp_path / "broker-ca.crt").write_bytes(server_ca.cert_pem)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(tmp_path / "srv.crt"), str(tmp_path / "srv.key"))
        broker = FakeBroker(token_reply, tls=tls)
        await broker.start()
        runtime_id = f"rt-{suffix}"
        env = AgentEnv(
            cluster=cluster, namespace=klm.KYMA_NAMESPACE, workdir=tmp_path, runtime_id=runtime_id
        )
        stand_in = klm.RolloutStandIn(cluster)
        rt = Runtime(
            kcp,
            cluster,
            f"kyma-{suffix}",
            runtime_id,
            env,
            broker,
            tmp_path / "broker-ca.crt",
            stand_in,
        )
        stand_in.readiness[CONFIG.manager.name] = rt.agent_ready
        stand_in.start()
        kcp.landscape.add_runtime(cluster, kyma=rt.kyma, runtime_id=runtime_id)
        try:
            yield rt
        finally:
            await env.stop_all()
            await broker.stop()
            stand_in.stop()
            klm.leave_runtime(kcp.cluster, rt.kyma)
    finally:
        cluster.stop()
