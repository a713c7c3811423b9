"""The real lifecycle-manager around the agent: one KCP with KLM and the registry per test
module, one fresh runtime (its own API server) per test, since KLM owns `kyma-system/default`
there and a runtime has one Kyma. The exception is the runtime on a real node (`node_runtime`):
one node per machine, so one such runtime per test module, its tests taking turns on it."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.process import Agent
from devenv import klm
from devenv import kyma_module as km
from devenv.clusters import Binaries, TestCluster, start_cluster
from devenv.demo.agent_pod import pod_manifest
from devenv.node import HOST_IP, NodeBusy, NodeCluster, start_node_cluster
from devenv.node import images as node_images
from tests.integration.agent.conftest import AgentEnv, FakeBroker, Pki, problem_reply, token_reply
from tests.integration.node.conftest import UNAVAILABLE, project_image
from tests.integration.waiting import eventually

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
        manifest: Path | None = None,
    ) -> None:
        """The module as the landscape's pipeline publishes it: the OCM component from
        module-config.yaml's name and version (what modulectl reads) with the raw manifest,
        then `make module`'s ModuleTemplate and ModuleReleaseMeta, unchanged. The arguments
        publish it wrong, or (`manifest`) with what a node here needs changed."""
        self.landscape.registry.push(
            component=CONFIG.name,
            version=version,
            manifest=manifest or self.module_files / km.MANIFEST_FILE,
            resource=resource,
        )
        klm.apply_module(
            self.cluster, [template or self.template(), release_meta or self.release_meta()]
        )


def klm_yaml(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = km.yaml.safe_load(path.read_text())
    return loaded


@pytest.fixture(scope="module")
def landscape(
    klm_build: klm.KlmBuild, binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[klm.Landscape]:
    """A KCP with the registry and KLM, no module published yet."""
    workdir = tmp_path_factory.mktemp("klm-kcp")
    cluster = start_cluster("klm-kcp", binaries, workdir=workdir / "cluster")
    try:
        with klm.running(klm_build, cluster, workdir) as running:
            yield running
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kcp(landscape: klm.Landscape, module_files: Path) -> Kcp:
    published = Kcp(landscape, module_files)
    published.publish()
    return published


@dataclass
class Managed:
    """A runtime KLM manages: its cluster, and its Kyma in the KCP."""

    kcp: Kcp
    cluster: TestCluster
    kyma: str
    runtime_id: str

    def kcp_kyma(self) -> dict[str, Any] | None:
        return klm.kcp_kyma(self.kcp.cluster, self.kyma)

    def module_state(self) -> str | None:
        status = klm.module_status(self.kcp_kyma(), MODULE)
        return None if status is None else status.get("state")

    def kyma_state(self) -> str | None:
        return ((self.kcp_kyma() or {}).get("status") or {}).get("state")


@dataclass
class Runtime(Managed):
    """A runtime without a node, with the agent's broker and, once started, the agent as a
    local process; its Deployment's status comes from the stand-in."""

    env: AgentEnv
    broker: FakeBroker
    ca_bundle: Path
    stand_in: klm.RolloutStandIn
    agent: Agent | None = None

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


# -- what the tests do and wait for, with or without a node ----------------------------------


INSTALL = 90.0  # KLM's first reconcile of a new runtime on a loaded 2-core machine


def skr_kyma(rt: Managed) -> dict[str, Any] | None:
    return runtime_object(rt, "kymas", "default")


async def enable_module(rt: Managed, module: str = MODULE) -> None:
    """What the customer does: the module in the runtime's own Kyma, which KLM created."""
    await eventually(lambda: skr_kyma(rt), what="KLM creating kyma-system/default", within=INSTALL)
    rt.cluster.custom.patch_namespaced_custom_object(
        *klm.OPERATOR,
        klm.KYMA_NAMESPACE,
        "kymas",
        "default",
        {"spec": {"modules": [{"name": module}]}},
    )


def deployment(rt: Managed, name: str) -> client.V1Deployment | None:
    try:
        return client.AppsV1Api(rt.cluster.api_client).read_namespaced_deployment(
            name, klm.KYMA_NAMESPACE
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def runtime_object(rt: Managed, plural: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = rt.cluster.custom.get_namespaced_custom_object(
            *klm.OPERATOR, klm.KYMA_NAMESPACE, plural, name
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


async def module_ready(rt: Managed) -> None:
    await eventually(
        lambda: rt.module_state() == "Ready" and rt.kyma_state() == "Ready",
        what="module and Kyma Ready",
        within=INSTALL,
        interval=0.5,
    )


# -- a runtime with a real node -----------------------------------------------------------------


class NodeBroker(FakeBroker):
    """The agent's broker on the pod bridge's host address: the one address of this machine a
    pod reaches (devenv.node's guard table)."""

    @property
    def url(self) -> str:
        return f"http://{HOST_IP}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, HOST_IP, self.port)


# Compass down: the broker answers, with a reason and when to ask again. The agent keeps asking
# and stays ready (docs/module.md), so the module is Ready while no token is issued.
COMPASS_DOWN = problem_reply(503, "compass-unavailable", retry_after="1")


@dataclass
class NodeRuntime(Managed):
    """A runtime on a cluster with a real node: the kubelet runs the agent from the manifest KLM
    applied, and kube-controller-manager writes its Deployment's status. No RolloutStandIn."""

    node: NodeCluster
    broker: NodeBroker
    added: float  # time.monotonic() when its Kyma was created in the KCP


@pytest.fixture(scope="module")
def node() -> Iterator[NodeCluster]:
    """One node for the module's tests (one node per machine: devenv.node's lock)."""
    if UNAVAILABLE:
        pytest.skip(f"no real node here: {UNAVAILABLE}")
    try:
        started = start_node_cluster("klm-runtime")
    except NodeBusy as exc:  # a shared machine; CI runs alone
        pytest.skip(str(exc))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
async def node_runtime(
    node: NodeCluster,  # first: where the node is busy or cannot run, nothing else starts
    landscape: klm.Landscape,
    module_files: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[NodeRuntime]:
    """The module published for a node, then the node's cluster given to KCP as a runtime.

    The manifest is `make module`'s with what this machine needs changed, as make demo's
    --agent-pod changes it: make image's image (imported into the node's containerd: no registry
    to pull it from), the broker's plain-http URL on the bridge's address (the URL the agent
    would build from KCP_ADDR must be https with a name this pod cannot resolve; that discovery
    is checked without a node), and a short backoff cap."""
    agent_image = project_image(node)
    klm.serve_watcher_image(landscape.registry, node_images.pause_archive())
    broker = NodeBroker(lambda n: COMPASS_DOWN)
    await broker.start()
    raw = [o for o in km.yaml.safe_load_all((module_files / km.MANIFEST_FILE).read_text()) if o]
    env = {
        "AGENT_BROKER_URL": broker.url,
        "AGENT_BACKOFF_CAP": "4",
    }
    objects = pod_manifest(raw, env=env)
    manifest = tmp_path_factory.mktemp("node-module") / km.MANIFEST_FILE
    manifest.write_text(km.dump_manifest(objects))
    kcp = Kcp(landscape, module_files)
    kcp.publish(manifest=manifest)
    (agent,) = [o for o in objects if o["kind"] == "Deployment"]
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == agent_image
    cluster = node.cluster
    cluster.apply_crds(RUNTIME_CRDS)
    cluster.create_namespace(klm.KYMA_NAMESPACE)
    # The application-connector module's signal, so the agent has a token to ask for.
    cluster.custom.create_namespaced_custom_object(
        "operator.kyma-project.io",
        "v1alpha1",
        klm.KYMA_NAMESPACE,
        "applicationconnectors",
        {
            "apiVersion": "operator.kyma-project.io/v1alpha1",
            "kind": "ApplicationConnector",
            "metadata": {"name": "applicationconnector"},
            "spec": {},
        },
    )
    suffix = uuid.uuid4().hex[:6]
    rt = NodeRuntime(
        kcp,
        cluster,
        f"kyma-{suffix}",
        f"rt-{suffix}",
        node=node,
        broker=broker,
        added=time.monotonic(),
    )
    landscape.add_runtime(cluster, kyma=rt.kyma, runtime_id=rt.runtime_id)
    try:
        yield rt
    finally:
        await broker.stop()
        klm.leave_runtime(landscape.kcp, rt.kyma)
