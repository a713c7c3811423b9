"""The agent installed by the real lifecycle-manager (KLM), from what `make module` produces.

KLM reads the module from the registry by ModuleReleaseMeta `ocmComponentName` and
ModuleTemplate `version`, renders the raw manifest into the runtime, and shows the agent's
Deployment status as the module state. With no kubelet, that status is written from the agent's
own `/readyz` (devenv.klm.RolloutStandIn; the other stand-ins are listed in docs/module.md).
Timings: KLM requeues every 2 s here; a first install is Ready 6-10 s after the module is enabled.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from devenv import klm
from devenv import kyma_module as km
from tests.integration.agent.conftest import problem_reply, token_reply
from tests.integration.klm.conftest import (
    CONFIG,
    INSTALL,
    MODULE,
    Kcp,
    Runtime,
    deployment,
    enable_module,
    module_ready,
    runtime_object,
    skr_kyma,
)
from tests.integration.waiting import eventually


def manifest_name(rt: Runtime) -> str:
    manifests = rt.kcp.cluster.custom.list_namespaced_custom_object(
        *klm.OPERATOR,
        klm.KCP_NAMESPACE,
        "manifests",
        label_selector=f"{klm.KYMA_NAME_LABEL}={rt.kyma}",
    )["items"]
    (manifest,) = [m for m in manifests if MODULE in m["metadata"]["name"]]
    return str(manifest["metadata"]["name"])


async def start_agent(rt: Runtime) -> None:
    """The agent as the Deployment KLM applied runs it: its environment (nothing per cluster),
    a token of the manifest's ServiceAccount, the application-connector module on."""
    found = await eventually(
        lambda: deployment(rt, CONFIG.manager.name), what="the agent Deployment", within=INSTALL
    )
    (container,) = found.spec.template.spec.containers
    env = {
        e.name.removeprefix("AGENT_").lower(): e.value
        for e in container.env or []
        if e.value is not None
        and e.name not in ("AGENT_NAMESPACE", "AGENT_HEALTH_ADDRESS", "AGENT_SA_TOKEN_FILE")
    }
    cluster = rt.cluster
    token = cluster.service_account_token(
        klm.KYMA_NAMESPACE, "compass-agent", audiences=[cluster.issuer]
    )
    kubeconfig = rt.env.workdir / "agent.kubeconfig"
    kubeconfig.write_text(cluster.kubeconfig_with_token(token, user="compass-agent"))
    # The release's template, https://compass-broker.{kcp_domain}, names no local host; this one
    # keeps KCP_ADDR's domain in the path, so the broker's log shows where the URL came from.
    env["broker_url_template"] = f"{rt.broker.url}/{{kcp_domain}}"
    settings = rt.env.settings(None, kubeconfig=kubeconfig, broker_ca_bundle=rt.ca_bundle, **env)
    assert settings.broker_url is None  # the manifest names no broker
    rt.env.put_application_connector()
    rt.agent = await rt.env.start(settings)


async def installed_and_ready(rt: Runtime) -> None:
    await enable_module(rt)
    await start_agent(rt)
    await eventually(rt.env.secret_data, what="the token secret", within=30)
    await module_ready(rt)


async def test_enabled_module_is_installed_and_the_kyma_goes_ready_with_the_agents_readiness(
    runtime: Runtime,
) -> None:
    await installed_and_ready(runtime)
    # The agent found the broker from KCP_ADDR on the skr-webhook KLM made: the Gateway's host
    # (skr-events.kcp.example.test) minus its first label.
    assert runtime.broker.paths == [f"/kcp.example.test/v1/runtimes/{runtime.runtime_id}/token"]
    webhook = deployment(runtime, klm.WEBHOOK_DEPLOYMENT)
    assert webhook is not None
    env = {e.name: e.value for e in webhook.spec.template.spec.containers[0].env or []}
    assert env["KCP_ADDR"] == f"{klm.KCP_EVENTS_HOST}:443"
    # The runtime ID came from the label KLM put on the runtime's Kyma.
    labels = (skr_kyma(runtime) or {})["metadata"]["labels"]
    assert labels[klm.RUNTIME_ID_LABEL] == runtime.runtime_id


async def test_objects_carry_what_the_imitation_says_lifecycle_manager_puts_on_them(
    runtime: Runtime,
) -> None:
    """devenv.kyma_module stands in for KLM in the other module tests and the demo: its labels
    and annotations must be KLM's, object by object."""
    await enable_module(runtime)
    await eventually(
        lambda: deployment(runtime, CONFIG.manager.name), what="the agent", within=INSTALL
    )
    name = manifest_name(runtime)
    raw = km.yaml.safe_load_all((runtime.kcp.module_files / km.MANIFEST_FILE).read_text())
    imitated = km.as_lifecycle_manager_renders(
        [o for o in raw if o], owner=f"{klm.KCP_NAMESPACE}/{name}"
    )
    for want in imitated:
        got = read_raw(runtime, want)
        for key in (km.MANAGED_BY_LABEL, km.PART_OF_LABEL, km.COMPONENT_LABEL):
            assert got["metadata"]["labels"][key] == want["metadata"]["labels"][key], (
                want["kind"],
                key,
            )
        for key in (km.OWNED_BY_ANNOTATION, km.DISCLAIMER_ANNOTATION):
            assert got["metadata"]["annotations"][key] == want["metadata"]["annotations"][key]
        assert got["metadata"].get("namespace") == want["metadata"].get("namespace")
        managers = {m["manager"] for m in got["metadata"]["managedFields"]}
        assert km.FIELD_MANAGER in managers
    # KLM's catalog sync: the runtime gets the ModuleTemplate and ModuleReleaseMeta (beta Kyma).
    for kind, plural, obj_name in (
        ("ModuleTemplate", "moduletemplates", CONFIG.template_name),
        ("ModuleReleaseMeta", "modulereleasemetas", MODULE),
    ):
        copied = await eventually(
            lambda p=plural, n=obj_name: runtime_object(runtime, p, n),
            what=f"the {kind} copied into the runtime",
            within=INSTALL,
        )
        want = km.as_lifecycle_manager_syncs_to_runtime(copied_source(runtime, kind))
        # The copy also shows the CRD's defaults of fields make module leaves out.
        assert {k: copied["spec"].get(k) for k in want["spec"]} == want["spec"]
        assert copied["metadata"]["namespace"] == want["metadata"]["namespace"]
        assert want["metadata"]["labels"].items() <= copied["metadata"]["labels"].items()
    labels, annotations = km.runtime_kyma_marks(runtime.kyma, runtime.runtime_id)
    metadata = (skr_kyma(runtime) or {})["metadata"]
    assert labels.items() <= metadata["labels"].items()
    assert annotations.items() <= metadata["annotations"].items()


def copied_source(rt: Runtime, kind: str) -> dict[str, Any]:
    return rt.kcp.template() if kind == "ModuleTemplate" else rt.kcp.release_meta()


def read_raw(rt: Runtime, obj: dict[str, Any]) -> dict[str, Any]:
    resource = DynamicClient(rt.cluster.api_client).resources.get(
        api_version=obj["apiVersion"], kind=obj["kind"]
    )
    found = resource.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
    result: dict[str, Any] = found.to_dict()
    return result


async def test_a_failing_readyz_shows_in_the_module_state(runtime: Runtime) -> None:
    # Compass down: the broker answers 503 with Retry-After. The agent backs off for a stated
    # reason and stays ready, so the module is Ready: Compass being down must not turn it red.
    answers = {"now": problem_reply(503, "compass-unavailable", retry_after="1")}
    runtime.broker.script = lambda n: answers["now"]
    await enable_module(runtime)
    await start_agent(runtime)
    await module_ready(runtime)
    assert runtime.env.secret_data() is None
    # The broker gone (a NetworkPolicy, DNS): /readyz fails, and KLM shows it.
    await runtime.broker.stop()
    agent = runtime.agent
    assert agent is not None
    # Asked in-process: an HTTP call from this thread would block the loop the agent serves on.
    await eventually(lambda: agent.reconciler.readiness()[0] is False, what="not ready", within=60)
    await eventually(
        lambda: runtime.module_state() not in ("Ready", None) and runtime.kyma_state() != "Ready",
        what="module and Kyma no longer Ready",
        within=INSTALL,
        interval=0.5,
    )
    answers["now"] = token_reply(1)
    await runtime.broker.start()
    await eventually(runtime.env.secret_data, what="the token secret", within=30)
    await module_ready(runtime)


async def test_removed_module_objects_go_and_the_secret_stays(runtime: Runtime) -> None:
    await installed_and_ready(runtime)
    before = runtime.env.secret_data()
    runtime.cluster.custom.patch_namespaced_custom_object(
        *klm.OPERATOR, klm.KYMA_NAMESPACE, "kymas", "default", {"spec": {"modules": []}}
    )
    await eventually(
        lambda: deployment(runtime, CONFIG.manager.name) is None,
        what="the agent Deployment deleted by KLM",
        within=INSTALL,
    )
    await runtime.env.stop_all()  # the kubelet would stop the pod
    rbac = client.RbacAuthorizationV1Api(runtime.cluster.api_client)
    await eventually(
        lambda: (
            not [
                r
                for r in rbac.list_namespaced_role(klm.KYMA_NAMESPACE).items
                if r.metadata.name == "compass-agent"
            ]
        ),
        what="the agent's Role deleted",
        within=INSTALL,
    )
    await eventually(
        lambda: klm.module_status(runtime.kcp_kyma(), MODULE) is None,
        what="the module gone from the Kyma status",
        within=INSTALL,
    )
    assert runtime.env.secret_data() == before


async def test_kyma_deleted_klm_removes_the_module_then_the_runtimes_kyma_and_the_secret_stays(
    runtime: Runtime,
) -> None:
    await installed_and_ready(runtime)
    before = runtime.env.secret_data()
    requests = len(runtime.broker.requests)
    runtime.kcp.cluster.custom.delete_namespaced_custom_object(
        *klm.OPERATOR, klm.KCP_NAMESPACE, "kymas", runtime.kyma
    )
    # KLM's order (kyma/deletion): the module's objects first, the runtime's Kyma after them. So
    # the agent is gone (the kubelet stops the pod of a deleted Deployment) before its Kyma
    # carries a deletionTimestamp.
    await eventually(
        lambda: deployment(runtime, CONFIG.manager.name) is None,
        what="the agent Deployment deleted by KLM",
        within=INSTALL,
    )
    await runtime.env.stop_all()
    await eventually(
        lambda: runtime.kcp_kyma() is None,
        what="the KCP Kyma deleted (KLM's finalizer done)",
        within=INSTALL,
        interval=0.5,
    )
    assert skr_kyma(runtime) is None  # and KLM deleted the Kyma CRD there too (also 404)
    assert runtime.env.secret_data() == before
    assert len(runtime.broker.requests) == requests


# -- a module published wrong does not install -------------------------------------------------


@dataclass(frozen=True)
class Mistake:
    """One way to publish the module wrong, and the part of KLM's message that names it."""

    says: str
    ocm_component_name: str = CONFIG.name
    template_version: str = CONFIG.version
    pushed_version: str = CONFIG.version
    resource: str = "raw-manifest"


# Each key becomes part of a module name, which KLM's CRD allows only as words of 3+ letters.
MISTAKES = {
    "name": Mistake(
        ocm_component_name=f"{CONFIG.name}-typo",
        says=f"component-descriptors/{CONFIG.name}-typo:{CONFIG.version}",
    ),
    "version": Mistake(
        template_version="0.0.1-not-pushed",
        says=f"component-descriptors/{CONFIG.name}:0.0.1-not-pushed",
    ),
    # The manifest under the ModuleTemplate's resource name instead of OCM's `raw-manifest`:
    # not even a valid OCM resource name.
    "layout": Mistake(
        template_version=f"{CONFIG.version}-layout",
        pushed_version=f"{CONFIG.version}-layout",
        resource="rawManifest",
        says="component.resources.0.name: Does not match pattern",
    ),
    # A valid component without a `raw-manifest`: KLM has nothing to install (the Kyma's last
    # operation says so; the module gets no status).
    "unrenderable": Mistake(
        template_version=f"{CONFIG.version}-no-raw",
        pushed_version=f"{CONFIG.version}-no-raw",
        resource="manifest",
        says="spec.install.source in body must be of type object",
    ),
}


@pytest.mark.parametrize("case", MISTAKES.keys())
async def test_a_module_published_wrong_is_an_error_and_installs_nothing(
    kcp: Kcp, runtime: Runtime, case: str
) -> None:
    """Published as a module of its own name, so KLM has nothing of the good one cached. The
    component is pushed as always (module-config.yaml's name and version) unless the mistake is
    in the push."""
    mistake, name = MISTAKES[case], f"{MODULE}-{case}"
    template, release_meta = copy.deepcopy(kcp.template()), copy.deepcopy(kcp.release_meta())
    template["metadata"]["name"] = f"{name}-{mistake.template_version}"
    template["metadata"]["labels"]["operator.kyma-project.io/module-name"] = name
    template["spec"]["moduleName"] = name
    template["spec"]["version"] = mistake.template_version
    release_meta["metadata"]["name"] = release_meta["spec"]["moduleName"] = name
    release_meta["spec"]["ocmComponentName"] = mistake.ocm_component_name
    for channel in release_meta["spec"]["channels"]:
        channel["version"] = mistake.template_version
    kcp.publish(
        template=template,
        release_meta=release_meta,
        version=mistake.pushed_version,
        resource=mistake.resource,
    )
    await enable_module(runtime, name)

    def message() -> str:
        kyma = runtime.kcp_kyma() or {}
        operation = ((kyma.get("status") or {}).get("lastOperation") or {}).get("operation", "")
        module = klm.module_status(kyma, name) or {}
        return f"{module.get('message', '')} {operation}"

    await eventually(
        lambda: mistake.says in message(),
        what=f"KLM's message naming the mistake ({mistake.says})",
        within=INSTALL,
        interval=0.5,
    )
    assert (klm.module_status(runtime.kcp_kyma(), name) or {}).get("state", "Error") == "Error"
    assert runtime.kyma_state() == "Error"
    assert deployment(runtime, CONFIG.manager.name) is None
