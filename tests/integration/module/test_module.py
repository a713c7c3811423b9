"""The agent as a Kyma module, on real API servers with the published Kyma CRDs.

The ModuleTemplates and the ModuleReleaseMeta must be accepted by lifecycle-manager's CRDs; the
raw manifest is applied server-side the way lifecycle-manager applies it, and the agent runs
under exactly the manifest's RBAC (a token of the manifest's ServiceAccount), finds the broker
and its runtime ID without any per-cluster value, and its readiness — what lifecycle-manager
shows as the module state — says whether it can do its job. Then the three ways the module goes
away (docs/module.md#removal), none of which may race the loss of the agent's own RBAC.

Each test gets its own namespace standing in for kyma-system, and its own names for the
cluster-scoped objects (`retarget`), because the test clusters are shared.
"""

from __future__ import annotations

import asyncio
import copy
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.process import Agent
from devenv import kyma_module as km
from devenv.clusters import Binaries, TestCluster
from kubeapi import KubeClient, KubeRejected, access_from_kubeconfig_file
from tests.integration.agent.conftest import (
    AgentEnv,
    FakeBroker,
    Pki,
    problem_reply,
    token_reply,
)
from tests.integration.waiting import eventually

CONFIG = km.load_config()
TEST_MANAGER = "kyma-compass-pull-tests"
PLURALS = {
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "ModuleTemplate": ("/apis/operator.kyma-project.io/v1beta2", "moduletemplates"),
    "ModuleReleaseMeta": ("/apis/operator.kyma-project.io/v1beta2", "modulereleasemetas"),
}


def path_of(obj: dict[str, Any]) -> str:
    prefix, plural = PLURALS[obj["kind"]]
    name = obj["metadata"]["name"]
    namespace = obj["metadata"].get("namespace")
    if namespace:
        return f"{prefix}/namespaces/{namespace}/{plural}/{name}"
    return f"{prefix}/{plural}/{name}"


@pytest.fixture(scope="module")
def manifest(binaries: Binaries) -> list[dict[str, Any]]:
    objects = km.render_manifest(binaries.helm, CONFIG)
    km.check_manifest(objects, CONFIG)
    return objects


def retarget(objects: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The manifest with `namespace` for kyma-system and per-test cluster-scoped names."""
    out = []
    for raw in copy.deepcopy(objects):
        metadata = raw["metadata"]
        if metadata.get("namespace") == km.KYMA_NAMESPACE:
            metadata["namespace"] = namespace
        if raw["kind"] in km.CLUSTER_SCOPED:
            metadata["name"] = f"{metadata['name']}-{namespace}"
        if raw["kind"] == "ClusterRoleBinding":
            raw["roleRef"]["name"] = f"{raw['roleRef']['name']}-{namespace}"
        for subject in raw.get("subjects", []):
            subject["namespace"] = namespace
        out.append(raw)
    return out


async def apply_like_lifecycle_manager(
    kube: KubeClient, objects: list[dict[str, Any]], *, namespace: str
) -> list[dict[str, Any]]:
    rendered = km.as_lifecycle_manager_renders(
        objects, owner=f"kcp-system/{namespace}-compass-agent", namespace=namespace
    )
    return [
        await kube.apply(path_of(obj), obj, field_manager=km.FIELD_MANAGER, force=True)
        for obj in rendered
    ]


async def remove_like_lifecycle_manager(kube: KubeClient, applied: list[dict[str, Any]]) -> None:
    """Two concurrent batches, as its cleanup does: 'managed' kinds, then everything else."""
    first = [o for o in applied if o["kind"] in ("NetworkPolicy", "ConfigMap")]
    rest = [o for o in applied if o not in first]
    for batch in (first, rest):
        await asyncio.gather(*(kube.delete(path_of(o)) for o in batch))


@dataclass
class Module:
    env: AgentEnv
    admin: KubeClient
    applied: list[dict[str, Any]]
    kubeconfig: Path  # the manifest's ServiceAccount
    env_of_deployment: dict[str, str]
    broker: FakeBroker
    ca_bundle: Path

    def settings(self, **changes: Any) -> Any:
        """The Deployment's own environment (nothing per cluster in it), with only what a pod
        would have differently: the namespace (kyma-system here is the test's), the kubeconfig
        instead of the in-cluster token, a local health port and short test timings."""
        manifest_env = {
            k.removeprefix("AGENT_").lower(): v
            for k, v in self.env_of_deployment.items()
            if k not in ("AGENT_NAMESPACE", "AGENT_HEALTH_ADDRESS", "AGENT_SA_TOKEN_FILE")
        }
        values = {**manifest_env, "broker_ca_bundle": self.ca_bundle, **changes}
        settings = self.env.settings(None, kubeconfig=self.kubeconfig, **values)
        assert settings.broker_url is None  # the manifest names no broker
        return settings

    def put_configmap(self, **data: str) -> None:
        body = {"metadata": {"name": "compass-agent"}, "data": data}
        core = self.env.cluster.core
        try:
            core.replace_namespaced_config_map("compass-agent", self.env.namespace, body)
        except Exception:
            core.create_namespaced_config_map(self.env.namespace, body)


@pytest.fixture
async def module(
    agent_env: AgentEnv, manifest: list[dict[str, Any]], tmp_path: Path
) -> AsyncIterator[Module]:
    cluster: TestCluster = agent_env.cluster
    ns = agent_env.namespace
    server_ca = Pki("broker-ca")
    server = server_ca.issue("127.0.0.1", server=True)
    server.write(tmp_path / "srv.crt", tmp_path / "srv.key")
    (tmp_path / "broker-ca.crt").write_bytes(server_ca.cert_pem)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(tmp_path / "srv.crt"), str(tmp_path / "srv.key"))
    broker = FakeBroker(token_reply, tls=tls)
    await broker.start()
    async with KubeClient(
        access_from_kubeconfig_file(cluster.kubeconfig_path), user_agent="t"
    ) as admin:
        applied = await apply_like_lifecycle_manager(admin, retarget(manifest, ns), namespace=ns)
        token = cluster.service_account_token(ns, "compass-agent", audiences=[cluster.issuer])
        kubeconfig = tmp_path / "agent.kubeconfig"
        kubeconfig.write_text(cluster.kubeconfig_with_token(token, user=f"{ns}:compass-agent"))
        (deployment,) = [o for o in applied if o["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        try:
            yield Module(
                agent_env, admin, applied, kubeconfig, env, broker, tmp_path / "broker-ca.crt"
            )
        finally:
            await agent_env.stop_all()
            await broker.stop()


async def readyz(agent: Agent) -> tuple[int, str]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{agent.health.port}") as http:
        response = await http.get("/readyz")
    return response.status_code, response.text


# -- the templates --------------------------------------------------------------------------


async def test_templates_and_release_meta_are_accepted_by_the_published_crds(
    control_plane: TestCluster, runtime_a: TestCluster, namespace_factory: Callable[..., str]
) -> None:
    kcp_ns, skr_ns = namespace_factory(control_plane), namespace_factory(runtime_a)
    template, community = km.module_template(CONFIG), km.community_module_template(CONFIG)
    release_meta = km.yaml.safe_load((km.MODULE_DIR / "module-release-meta.yaml").read_text())
    template["metadata"]["namespace"] = release_meta["metadata"]["namespace"] = kcp_ns
    community["metadata"]["namespace"] = skr_ns
    async with KubeClient(
        access_from_kubeconfig_file(control_plane.kubeconfig_path), user_agent="t"
    ) as kcp:
        stored = await kcp.apply(path_of(template), template, field_manager=TEST_MANAGER)
        assert stored["spec"]["resources"] == template["spec"]["resources"]
        assert stored["spec"]["manager"]["name"] == "compass-agent"
        stored_meta = await kcp.apply(
            path_of(release_meta), release_meta, field_manager=TEST_MANAGER
        )
        assert {c["version"] for c in stored_meta["spec"]["channels"]} == {CONFIG.version}
        # The schema is really enforced: the same objects with a required field gone are refused.
        broken = copy.deepcopy(release_meta)
        broken["metadata"]["name"] = "broken"
        del broken["spec"]["moduleName"]
        with pytest.raises(KubeRejected, match="moduleName"):
            await kcp.apply(path_of(broken), broken, field_manager=TEST_MANAGER)
        no_descriptor = copy.deepcopy(template)
        no_descriptor["metadata"]["name"] = "broken"
        del no_descriptor["spec"]["descriptor"]
        with pytest.raises(KubeRejected, match="descriptor"):
            await kcp.apply(path_of(no_descriptor), no_descriptor, field_manager=TEST_MANAGER)
    async with KubeClient(
        access_from_kubeconfig_file(runtime_a.kubeconfig_path), user_agent="t"
    ) as skr:
        stored = await skr.apply(path_of(community), community, field_manager=TEST_MANAGER)
        assert stored["spec"]["resources"][0]["link"] == str(CONFIG.manifest)


# -- applied as lifecycle-manager applies it ----------------------------------------------------


async def test_applied_like_lifecycle_manager_the_agent_works_under_the_manifests_rbac(
    module: Module,
) -> None:
    for obj in module.applied:
        labels, annotations = obj["metadata"]["labels"], obj["metadata"]["annotations"]
        assert labels[km.MANAGED_BY_LABEL] == "kyma"
        assert annotations[km.OWNED_BY_ANNOTATION].startswith("kcp-system/")
        assert "app.kubernetes.io/managed-by" not in labels  # Helm's mark is gone
        if obj["kind"] not in km.CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == module.env.namespace
    assert [o["kind"] for o in module.applied].count("Deployment") == 1
    # The BYOC way: the customer names broker and runtime in one ConfigMap; no Kyma label.
    module.put_configmap(brokerURL=module.broker.url, runtimeID=module.env.runtime_id)
    module.env.put_kyma(modules=["application-connector"], runtime_label=False)
    agent = await module.env.start(module.settings())
    await eventually(module.env.secret_data, what="the token secret", within=20)
    assert module.broker.paths == [f"/v1/runtimes/{module.env.runtime_id}/token"]
    assert (await readyz(agent))[0] == 200


async def test_managed_runtime_finds_the_broker_from_kcp_addr_and_the_runtime_from_the_kyma(
    module: Module,
) -> None:
    agent = await module.env.start(module.settings(broker_url_template=module.broker.url))
    module.env.put_kyma(modules=["application-connector"])  # with the runtime-id label
    # No ConfigMap and no skr-webhook yet: nowhere to send the request, and it says so.
    await eventually(lambda: agent.reconciler.last_plan is not None, what="a first turn")
    status, body = await readyz(agent)
    assert (status, body.split(":")[0]) == (503, "not ready")
    assert "broker URL unknown" in body
    # lifecycle-manager's webhook carries KCP_ADDR on a managed runtime.
    await module.admin.apply(
        f"/apis/apps/v1/namespaces/{module.env.namespace}/deployments/skr-webhook",
        skr_webhook(module.env.namespace, "skr-events.kcp.example.test:443"),
        field_manager=TEST_MANAGER,
    )
    agent.reconciler.trigger()  # the agent re-reads on its resync; the test does not wait that
    await eventually(module.env.secret_data, what="the token secret", within=20)
    assert module.broker.paths == [f"/v1/runtimes/{module.env.runtime_id}/token"]
    assert (await readyz(agent))[0] == 200


def skr_webhook(namespace: str, kcp_addr: str) -> dict[str, Any]:
    labels = {"app": "skr-webhook"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "skr-webhook", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "example.test/skr-webhook:1",
                            "env": [{"name": "KCP_ADDR", "value": kcp_addr}],
                        }
                    ]
                },
            },
        },
    }


async def test_readiness_is_false_without_an_answer_and_true_while_told_to_back_off(
    module: Module,
) -> None:
    answers = {"now": problem_reply(503, "compass-unavailable", retry_after="1")}
    module.broker.script = lambda n: answers["now"]
    module.put_configmap(brokerURL=module.broker.url)
    module.env.put_kyma(modules=["application-connector"])
    agent = await module.env.start(module.settings())
    # Compass down: the broker answers 503 with Retry-After, a stated reason; still ready.
    await eventually(lambda: len(module.broker.requests) >= 3, what="three 503s")
    status, body = await readyz(agent)
    assert status == 200, body
    # The broker goes away entirely (a NetworkPolicy, DNS, a wrong URL): not ready, with why.
    await module.broker.stop()
    await eventually(lambda: agent.reconciler.readiness()[0] is False, what="not ready", within=20)
    status, body = await readyz(agent)
    assert status == 503
    assert "no answer from the broker" in body
    # Back, answering: ready again once it answers.
    answers["now"] = token_reply(1)
    await module.broker.start()
    await eventually(module.env.secret_data, what="the token secret", within=20)
    assert (await readyz(agent))[0] == 200


# -- removal ---------------------------------------------------------------------------------


async def test_module_removed_the_secret_stays_and_the_agent_stops_cleanly(module: Module) -> None:
    module.put_configmap(brokerURL=module.broker.url)
    module.env.put_kyma(modules=["application-connector"])
    await module.env.start(module.settings())
    await eventually(module.env.secret_data, what="the token secret", within=20)
    before = module.env.secret_data()
    # lifecycle-manager deletes the objects (RBAC and Deployment at once); the kubelet stops
    # the pod meanwhile. Nothing of this may take the secret the runtime agent depends on.
    await asyncio.gather(
        remove_like_lifecycle_manager(module.admin, module.applied), module.env.stop_all()
    )
    assert module.env.secret_data() == before


async def test_application_connector_disabled_the_agent_removes_the_secret(module: Module) -> None:
    module.put_configmap(brokerURL=module.broker.url)
    module.env.put_kyma(modules=["application-connector"])
    await module.env.start(module.settings())
    await eventually(module.env.secret_data, what="the token secret", within=20)
    module.env.put_kyma(modules=[])  # the agent keeps its RBAC: only the other module goes
    await eventually(lambda: module.env.secret_data() is None, what="the secret removed")


async def test_kyma_being_deleted_the_agent_neither_pulls_nor_deletes(module: Module) -> None:
    module.put_configmap(brokerURL=module.broker.url)
    cluster, ns = module.env.cluster, module.env.namespace
    module.env.put_kyma(modules=["application-connector"])
    # lifecycle-manager's finalizer keeps the Kyma while it removes the modules.
    cluster.custom.patch_namespaced_custom_object(
        "operator.kyma-project.io",
        "v1beta2",
        ns,
        "kymas",
        "default",
        {"metadata": {"finalizers": ["operator.kyma-project.io/kyma-test"]}},
    )
    cluster.custom.delete_namespaced_custom_object(
        "operator.kyma-project.io", "v1beta2", ns, "kymas", "default"
    )
    agent = await module.env.start(module.settings())
    await eventually(
        lambda: (
            agent.reconciler.last_plan is not None
            and agent.reconciler.last_plan.reason == "kyma-deleting"
        ),
        what="the agent seeing the deletion",
    )
    await remove_like_lifecycle_manager(module.admin, module.applied)
    assert module.broker.requests == []  # no token for a runtime on its way out
    cluster.custom.patch_namespaced_custom_object(
        "operator.kyma-project.io",
        "v1beta2",
        ns,
        "kymas",
        "default",
        {"metadata": {"finalizers": None}},
    )
