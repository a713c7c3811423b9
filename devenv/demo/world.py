"""The demo's Kubernetes objects: what KCP, KLM and the user would create, and how to read them.

Holds: objects look like the real ones (names, namespaces, labels; see the architecture brief):
- KCP (`kcp-system`): one Kyma CR per runtime, named the lower-cased runtime ID and labelled the
  way KCP labels it, and for a managed runtime its kubeconfig Secret `kubeconfig-<runtime-id>`
  (key `config`, label `operator.kyma-project.io/kyma-name`); a BYOC runtime has none there: its
  cluster publishes its ServiceAccount issuer, which an operator approves (enrolment);
- a managed runtime has the Kyma CR `kyma-system/default` labelled by KLM with its runtime ID; a
  BYOC runtime has none, its agent is told the runtime ID, and enabling the module there means
  the module's manager created an `ApplicationConnector` CR;
- the agent arrives as the `compass-agent` Kyma module: in a managed runtime the user lists it
  in the Kyma CR and lifecycle-manager applies the module's release manifest (its rendering and
  server-side apply are played here); a BYOC customer applies the community module's manifest,
  the same bytes, and names the runtime ID in the ConfigMap `kyma-system/compass-agent`;
- the agent's identity is a ServiceAccount token of `kyma-system/compass-agent` (the manifest's
  ServiceAccount) with the broker's audience, written to a file as the kubelet projects it; it
  talks to its API server with a token of the same ServiceAccount, so it runs under exactly the
  module's RBAC.
Nothing here prints a token.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from devenv import kyma_module
from devenv.clusters import TestCluster
from devenv.runtime_agent_sim import TokenSecret
from kubeapi import access_from_kubeconfig_file

KCP_NAMESPACE = "kcp-system"
RUNTIME_NAMESPACE = "kyma-system"
AGENT_SERVICE_ACCOUNT = "compass-agent"
AUDIENCE = "compass-broker"
MODULE = "application-connector"
AGENT_MODULE = "compass-agent"  # the module the agent ships as (module/module-config.yaml)
TOKEN_SECRET = "compass-agent-configuration"  # noqa: S105 - a name
SA_TOKEN_SECONDS = 600  # what the agent chart projects: short-lived, rotated by the kubelet

KYMA = ("operator.kyma-project.io", "v1beta2", "kymas")
MAPPING = ("operator.kyma-project.io", "v1beta1", "compassmanagermappings")
APPLICATION_CONNECTOR = ("operator.kyma-project.io", "v1alpha1", "applicationconnectors")
COMPASS_CONNECTION = ("compass.kyma-project.io", "v1alpha1", "compassconnections")
ENROLMENT_ANNOTATIONS = "compass-broker.kyma-project.io"  # the broker's annotations on a mapping
AZURE_PLAN_ID = "4deee563-e5ec-4731-b9b1-53b42d855f0c"  # KEB's ID of the "azure" plan


@dataclass(frozen=True)
class RuntimeSpec:
    """One Kyma runtime of the demo, as KCP knows it."""

    key: str  # "A" or "B"
    managed: bool
    runtime_id: str
    global_account: str
    subaccount: str
    shoot: str
    instance_id: str

    @classmethod
    def new(cls, key: str, *, managed: bool) -> RuntimeSpec:
        return cls(
            key=key,
            managed=managed,
            runtime_id=str(uuid.uuid4()),
            global_account=str(uuid.uuid4()),
            subaccount=str(uuid.uuid4()),
            shoot=f"c-{uuid.uuid4().hex[:7]}",
            instance_id=str(uuid.uuid4()),
        )

    @property
    def kyma_name(self) -> str:
        return self.runtime_id.lower()

    @property
    def title(self) -> str:
        return f"runtime {self.key} ({'managed' if self.managed else 'BYOC'})"

    def kcp_labels(self) -> dict[str, str]:
        return {
            "kyma-project.io/runtime-id": self.runtime_id,
            "kyma-project.io/global-account-id": self.global_account,
            "kyma-project.io/subaccount-id": self.subaccount,
            "kyma-project.io/shoot-name": self.shoot,
            "kyma-project.io/instance-id": self.instance_id,
            "kyma-project.io/broker-plan-id": AZURE_PLAN_ID,
            "kyma-project.io/broker-plan-name": "azure",
            "kyma-project.io/region": "westeurope",
            "operator.kyma-project.io/kyma-name": self.kyma_name,
        }

    def skr_labels(self) -> dict[str, str]:
        """What KLM puts on `kyma-system/default` in a managed runtime."""
        return {
            "kyma-project.io/runtime-id": self.runtime_id,
            "kyma-project.io/global-account-id": self.global_account,
            "kyma-project.io/subaccount-id": self.subaccount,
        }


def _ignore_conflict(exc: ApiException) -> None:
    if exc.status != 409:
        raise exc


def _kyma(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{KYMA[0]}/{KYMA[1]}",
        "kind": "Kyma",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"channel": "regular", "modules": []},
    }


# -- seeding -----------------------------------------------------------------------------


def custom_resources_served(cluster: TestCluster, *, control_plane: bool) -> bool:
    """Whether every custom resource the demo uses can be listed yet.

    A fresh API server answers 429 "storage is (re)initializing" for a while after a CRD is
    Established; listing once also warms its watch cache before the components start watching.
    """
    kinds = [KYMA, APPLICATION_CONNECTOR] + ([MAPPING] if control_plane else [])
    try:
        for group, version, plural in kinds:
            cluster.custom.list_namespaced_custom_object(group, version, "default", plural)
        cluster.custom.list_cluster_custom_object(*COMPASS_CONNECTION)
    except ApiException as exc:
        if exc.status in (404, 429, 503):
            return False
        raise
    return True


def seed_control_plane(kcp: TestCluster, spec: RuntimeSpec, runtime: TestCluster) -> None:
    """The Kyma CR (no modules yet) and, for a managed runtime, its kubeconfig Secret, as KCP
    has them. A BYOC cluster instead publishes its ServiceAccount issuer's discovery."""
    kcp.create_namespace(KCP_NAMESPACE)
    kcp.custom.create_namespaced_custom_object(
        *KYMA[:2], KCP_NAMESPACE, KYMA[2], _kyma(spec.kyma_name, KCP_NAMESPACE, spec.kcp_labels())
    )
    if not spec.managed:
        runtime.publish_issuer_discovery()
        return
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=f"kubeconfig-{spec.kyma_name}",
            labels={"operator.kyma-project.io/kyma-name": spec.kyma_name},
        ),
        type="Opaque",
        data={"config": base64.b64encode(runtime.kubeconfig_text.encode()).decode()},
    )
    try:
        kcp.core.create_namespaced_secret(KCP_NAMESPACE, secret)
    except ApiException as exc:
        _ignore_conflict(exc)


def prepare_runtime(cluster: TestCluster, spec: RuntimeSpec, *, real_klm: bool = False) -> None:
    """`kyma-system` and, in a managed runtime, KLM's Kyma CR (the real KLM makes its own)."""
    cluster.create_namespace(RUNTIME_NAMESPACE)
    if spec.managed and not real_klm:
        cluster.custom.create_namespaced_custom_object(
            *KYMA[:2],
            RUNTIME_NAMESPACE,
            KYMA[2],
            _kyma("default", RUNTIME_NAMESPACE, spec.skr_labels()),
        )


def install_agent_module(
    kcp: TestCluster, cluster: TestCluster, spec: RuntimeSpec, manifest: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The agent arrives as the `compass-agent` module; returns what was done, in words.

    Managed: the user adds the module to the runtime's Kyma CR, KLM syncs it to KCP and applies
    the release manifest the way lifecycle-manager does. BYOC: the customer applies the
    community module's manifest into kyma-system and names the runtime ID in the module's
    ConfigMap (no Kyma CR carries it there)."""
    if spec.managed:
        add_module(cluster.custom, RUNTIME_NAMESPACE, "default", AGENT_MODULE)
        add_module(kcp.custom, KCP_NAMESPACE, spec.kyma_name, AGENT_MODULE)
        objects = kyma_module.as_lifecycle_manager_renders(
            manifest, owner=f"{KCP_NAMESPACE}/{spec.kyma_name}-{AGENT_MODULE}"
        )
        manager = kyma_module.FIELD_MANAGER
        done = [
            f"{AGENT_MODULE} added to spec.modules of Kyma {RUNTIME_NAMESPACE}/default "
            "(and synced to the KCP Kyma)",
            f"lifecycle-manager applies the release manifest ({len(objects)} objects, field "
            f"manager {manager}): {_kinds(objects)}",
        ]
    else:
        objects = [_in_namespace(obj, RUNTIME_NAMESPACE) for obj in manifest]
        manager = "kubectl"
        done = [
            f"the customer applies the community module's manifest: {_kinds(objects)}",
        ]
    dynamic = DynamicClient(cluster.api_client)
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        dynamic.server_side_apply(resource, body=obj, field_manager=manager, force_conflicts=True)
    if not spec.managed:
        cluster.core.create_namespaced_config_map(
            RUNTIME_NAMESPACE,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=AGENT_MODULE),
                data={"runtimeID": spec.runtime_id},
            ),
        )
        done.append(f"ConfigMap {RUNTIME_NAMESPACE}/{AGENT_MODULE}: runtimeID {spec.runtime_id}")
    return done


def _kinds(objects: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(sorted({str(obj["kind"]) for obj in objects}))


def _in_namespace(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """`kubectl apply -n <namespace>`: namespaced objects without one get it."""
    out = dict(obj)
    metadata = dict(out.get("metadata") or {})
    if out.get("kind") not in kyma_module.CLUSTER_SCOPED and not metadata.get("namespace"):
        metadata["namespace"] = namespace
    out["metadata"] = metadata
    return out


def agent_environment(manifest: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The agent container's environment as the module's Deployment sets it (values only)."""
    (deployment,) = [obj for obj in manifest if obj.get("kind") == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


def agent_kubeconfig(cluster: TestCluster, path: Path) -> None:
    """A kubeconfig with a token of the module's ServiceAccount (in a pod: the in-cluster token),
    so the agent has exactly the module's RBAC on its API server."""
    token = cluster.service_account_token(
        RUNTIME_NAMESPACE,
        AGENT_SERVICE_ACCOUNT,
        audiences=[cluster.issuer],
        expiration_seconds=24 * 3600,
    )
    path.write_text(
        cluster.kubeconfig_with_token(token, user=f"{RUNTIME_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}")
    )
    path.chmod(0o600)


def project_token(cluster: TestCluster, path: Path) -> str:
    """Writes a fresh agent ServiceAccount token to `path` (what the kubelet does); returns it."""
    token = cluster.service_account_token(
        RUNTIME_NAMESPACE,
        AGENT_SERVICE_ACCOUNT,
        audiences=[AUDIENCE],
        expiration_seconds=SA_TOKEN_SECONDS,
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(token)
    tmp.chmod(0o600)
    tmp.replace(path)  # atomically, as the kubelet swaps its symlink: no half-written token
    return token


def write_director_credentials(path: Path, *, client_id: str, secret: str, token_url: str) -> None:
    """compass-manager's credentials format, as mounted from its Secret."""
    path.write_text(
        f"data:\n  client_id: {client_id}\n  client_secret: {secret}\n"
        f"  tokens_endpoint: {token_url}\n"
    )
    path.chmod(0o600)


# -- what users, KLM and KCP do ------------------------------------------------------------


def add_module(
    custom: client.CustomObjectsApi, namespace: str, name: str, module: str = MODULE
) -> None:
    kyma = cast(
        dict[str, Any], custom.get_namespaced_custom_object(*KYMA[:2], namespace, KYMA[2], name)
    )
    modules = list(kyma.get("spec", {}).get("modules") or [])
    if all(m.get("name") != module for m in modules):
        modules.append({"name": module})
    custom.patch_namespaced_custom_object(
        *KYMA[:2], namespace, KYMA[2], name, {"spec": {"modules": modules}}
    )


def enable_module(
    kcp: TestCluster, cluster: TestCluster, spec: RuntimeSpec, *, real_klm: bool = False
) -> str:
    """Turns the module on in the runtime and in KCP; returns what was done, in words. The real
    KLM copies a managed runtime's spec.modules to the KCP Kyma itself."""
    if spec.managed:
        # The user edits the runtime's Kyma CR; KLM syncs spec.modules to the KCP Kyma.
        add_module(cluster.custom, RUNTIME_NAMESPACE, "default")
        done = f"{MODULE} added to spec.modules of Kyma {RUNTIME_NAMESPACE}/default in the runtime"
        if real_klm:
            return f"{done}; lifecycle-manager reads it there"
    else:
        # In a BYOC cluster the module's manager creates its CR when the module is installed.
        body = {
            "apiVersion": f"{APPLICATION_CONNECTOR[0]}/{APPLICATION_CONNECTOR[1]}",
            "kind": "ApplicationConnector",
            "metadata": {"name": "applicationconnector", "namespace": RUNTIME_NAMESPACE},
            "spec": {},
        }
        try:
            cluster.custom.create_namespaced_custom_object(
                *APPLICATION_CONNECTOR[:2], RUNTIME_NAMESPACE, APPLICATION_CONNECTOR[2], body
            )
        except ApiException as exc:
            _ignore_conflict(exc)
        done = (
            f"ApplicationConnector {RUNTIME_NAMESPACE}/applicationconnector created in the runtime"
        )
    add_module(kcp.custom, KCP_NAMESPACE, spec.kyma_name)
    return f"{done}; KCP Kyma {KCP_NAMESPACE}/{spec.kyma_name} lists the module"


def approve_issuer(kcp: TestCluster, spec: RuntimeSpec, issuer: str) -> str:
    """What the operator's one `kubectl annotate` does; returns that command."""
    kcp.custom.patch_namespaced_custom_object(
        *MAPPING[:2],
        KCP_NAMESPACE,
        MAPPING[2],
        spec.kyma_name,
        {
            "metadata": {
                "annotations": {
                    f"{ENROLMENT_ANNOTATIONS}/issuer-approved": issuer,
                    f"{ENROLMENT_ANNOTATIONS}/issuer-pending": None,
                    f"{ENROLMENT_ANNOTATIONS}/issuer-pending-since": None,
                }
            }
        },
    )
    return (
        f"kubectl -n {KCP_NAMESPACE} annotate compassmanagermapping {spec.kyma_name} --overwrite "
        f"{ENROLMENT_ANNOTATIONS}/issuer-approved={issuer} "
        f"{ENROLMENT_ANNOTATIONS}/issuer-pending- {ENROLMENT_ANNOTATIONS}/issuer-pending-since-"
    )


def delete_kyma(kcp: TestCluster, spec: RuntimeSpec) -> None:
    kcp.custom.delete_namespaced_custom_object(*KYMA[:2], KCP_NAMESPACE, KYMA[2], spec.kyma_name)


# -- reading -----------------------------------------------------------------------------


def read_or_none(read: Any, *args: Any) -> Any | None:
    """What `read(*args)` returns, or None where the object is not there (404)."""
    try:
        return read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def token_secret(cluster: TestCluster) -> TokenSecret | None:
    found = read_or_none(cluster.core.read_namespaced_secret, TOKEN_SECRET, RUNTIME_NAMESPACE)
    return None if found is None else TokenSecret.from_data(found.data)


def connection(cluster: TestCluster) -> dict[str, Any]:
    """`status` of the CompassConnection (empty while there is none)."""
    found = read_or_none(
        cluster.custom.get_cluster_custom_object, *COMPASS_CONNECTION, "compass-connection"
    )
    return dict((found or {}).get("status") or {})


def connection_state(cluster: TestCluster) -> str:
    return str(connection(cluster).get("connectionState") or "none")


def _mapping(kcp: TestCluster, spec: RuntimeSpec) -> dict[str, Any] | None:
    found = read_or_none(
        kcp.custom.get_namespaced_custom_object,
        *MAPPING[:2],
        KCP_NAMESPACE,
        MAPPING[2],
        spec.kyma_name,
    )
    return cast(dict[str, Any] | None, found)


def mapping_exists(kcp: TestCluster, spec: RuntimeSpec) -> bool:
    return _mapping(kcp, spec) is not None


def pending_issuer(kcp: TestCluster, spec: RuntimeSpec) -> str | None:
    """The issuer the broker recorded as pending on the runtime's mapping, if any."""
    annotations = ((_mapping(kcp, spec) or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(f"{ENROLMENT_ANNOTATIONS}/issuer-pending") or None


def enrolment_event(kcp: TestCluster, spec: RuntimeSpec) -> str | None:
    """The message of the broker's `EnrolmentPending` Event on the runtime's Kyma."""
    events = kcp.core.list_namespaced_event(
        KCP_NAMESPACE, field_selector="reason=EnrolmentPending"
    ).items
    return next((str(e.message) for e in events if e.involved_object.name == spec.kyma_name), None)


REVOKED_ANNOTATION = f"{ENROLMENT_ANNOTATIONS}/revoked"  # the broker's revocation mark


def mapping_table(kcp: TestCluster) -> tuple[list[str], list[list[str]]]:
    """`kubectl get compassmanagermappings -n kcp-system`: the server's Table (the CRD's
    printer columns), as kubectl asks for it."""
    access = access_from_kubeconfig_file(kcp.kubeconfig_path)
    with httpx.Client(base_url=access.server, verify=access.ssl_context(), timeout=10) as http:
        response = http.get(
            f"/apis/{MAPPING[0]}/{MAPPING[1]}/namespaces/{KCP_NAMESPACE}/{MAPPING[2]}",
            headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        )
        response.raise_for_status()
        table = response.json()
    # As kubectl shows it: columns of priority 0 only (the rest is -o wide), dates as ages.
    columns = [
        (i, c) for i, c in enumerate(table.get("columnDefinitions") or []) if not c.get("priority")
    ]
    headers = [str(c["name"]).upper() for _, c in columns]
    rows = [
        [_cell(row["cells"][i], c.get("type")) for i, c in columns]
        for row in table.get("rows") or []
    ]
    return headers, rows


def _cell(value: Any, kind: str | None) -> str:
    if value is None or value == "":
        return "<none>"
    if kind == "date":
        try:
            seconds = time.time() - datetime.fromisoformat(str(value)).timestamp()
        except ValueError:
            return str(value)
        return _age(max(0.0, seconds))
    return str(value)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def mapping_row(kcp: TestCluster, spec: RuntimeSpec) -> dict[str, str] | None:
    """The runtime's row of that table, by column name."""
    headers, rows = mapping_table(kcp)
    for row in rows:
        if row and row[0] == spec.kyma_name:
            return dict(zip(headers, row, strict=True))
    return None


def set_revoked(kcp: TestCluster, spec: RuntimeSpec, reason: str | None) -> str:
    """What the operator's one `kubectl annotate` does (None: un-revoke); returns it."""
    kcp.custom.patch_namespaced_custom_object(
        *MAPPING[:2],
        KCP_NAMESPACE,
        MAPPING[2],
        spec.kyma_name,
        {"metadata": {"annotations": {REVOKED_ANNOTATION: reason}}},
    )
    target = f"kubectl -n {KCP_NAMESPACE} annotate compassmanagermapping {spec.kyma_name}"
    if reason is None:
        return f"{target} {REVOKED_ANNOTATION}-"
    return f'{target} {REVOKED_ANNOTATION}="{reason}"'


def runtime_event(cluster: TestCluster, reason: str) -> str | None:
    """The message of the newest Event with `reason` in the runtime's kyma-system."""
    events = cluster.core.list_namespaced_event(
        RUNTIME_NAMESPACE, field_selector=f"reason={reason}"
    ).items
    return str(events[-1].message) if events else None


def runtime_kyma(cluster: TestCluster) -> dict[str, Any] | None:
    """`kyma-system/default` in a runtime, or None."""
    found = read_or_none(
        cluster.custom.get_namespaced_custom_object,
        *KYMA[:2],
        RUNTIME_NAMESPACE,
        KYMA[2],
        "default",
    )
    return cast(dict[str, Any] | None, found)


def kyma_exists(kcp: TestCluster, spec: RuntimeSpec) -> bool:
    found = read_or_none(
        kcp.custom.get_namespaced_custom_object, *KYMA[:2], KCP_NAMESPACE, KYMA[2], spec.kyma_name
    )
    return found is not None
