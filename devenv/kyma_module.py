"""The agent as a Kyma module: renders the release manifest and what modulectl would generate.

`python -m devenv.kyma_module --out dist/module` (what `make module` runs) writes:

    compass-agent.yaml                  the raw manifest: ONE multi-document YAML, rendered
                                        from charts/compass-agent with module/release-values.yaml
    moduletemplate-compass-agent-<v>.yaml   the ModuleTemplate for KCP (the fields modulectl
                                        writes; `spec.resources` links the raw manifest)
    community-moduletemplate-compass-agent-<v>.yaml   the ModuleTemplate a bring-your-own
                                        cluster adds as a community module
    module-release-meta.yaml            copied from module/, checked against the version

Always holds for a written manifest (`check_manifest`): exactly one workload, the Deployment
named by `manager`, its image tag equal to the module version (not `latest`/`main`); the
module's NetworkPolicies present; no Namespace and no Secret; nothing that names a cluster
(no broker URL, no runtime ID) — the same bytes for every cluster of every landscape.

`as_lifecycle_manager_renders` is what lifecycle-manager does to each object before its
server-side apply (namespace defaulting to kyma-system, its labels and annotations); tests and
the demo apply the manifest through it. tests/integration/klm checks it against the real
lifecycle-manager's objects.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

REPO_ROOT = Path(__file__).resolve().parents[1]
MODULE_DIR = REPO_ROOT / "module"
CHART = REPO_ROOT / "charts" / "compass-agent"
MANIFEST_FILE = "compass-agent.yaml"

KYMA_NAMESPACE = "kyma-system"
KCP_NAMESPACE = "kcp-system"
# What lifecycle-manager puts on every object it applies (render/default_transforms.go).
MANAGED_BY_LABEL = "operator.kyma-project.io/managed-by"
MANAGED_BY_VALUE = "kyma"
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF_VALUE = "Kyma"
# The Manifest that owns the object, `<kcp namespace>/<Manifest name>` (renamed from
# operator.kyma-project.io/owned-by in lifecycle-manager 1.12; api/shared/operator_labels.go).
OWNED_BY_ANNOTATION = "deprecated-operator.kyma-project.io/owned-by"
# The Manifest's name again, as a label (KymaComponentTransform); it overrides the chart's own.
COMPONENT_LABEL = "app.kubernetes.io/component"
WATCHED_BY_LABEL = "operator.kyma-project.io/watched-by"
RUNTIME_ID_LABEL = "kyma-project.io/runtime-id"
DISCLAIMER_ANNOTATION = "operator.kyma-project.io/managed-by-reconciler-disclaimer"
DISCLAIMER = (
    "DO NOT EDIT - This resource is managed by Kyma.\n"
    "Any modifications are discarded and the resource is reverted to the original state."
)
FIELD_MANAGER = "declarative.kyma-project.io/applier"

# Kinds a raw manifest may hold; cluster-scoped ones get no namespace.
CLUSTER_SCOPED = frozenset({"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"})
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet"})
FORBIDDEN_KINDS = frozenset({"Namespace", "Secret"})
# Environment that would tie the manifest to one cluster.
CLUSTER_SPECIFIC_ENV = frozenset({"AGENT_BROKER_URL", "AGENT_RUNTIME_ID", "AGENT_KUBECONFIG"})
# Helm's bookkeeping labels: meaningless once lifecycle-manager, not Helm, owns the objects.
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")

Obj = dict[str, Any]


class ManifestError(ValueError):
    """The rendered manifest breaks a rule of a module manifest; the message names the rule."""


class Icon(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    link: HttpUrl


class Manager(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    namespace: str = KYMA_NAMESPACE
    group: str
    version: str
    kind: str


class ModuleConfig(BaseModel):
    """module/module-config.yaml, the fields modulectl reads (moduleconfig.go)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    name: str = Field(pattern=r"^[a-z0-9.-]+/[a-z0-9/-]+$")
    version: str = Field(pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    manifest: HttpUrl
    repository: HttpUrl
    documentation: HttpUrl
    team: str = Field(pattern=r"^kyma/[a-z0-9-]+$")
    icons: list[Icon] = Field(min_length=1)
    manager: Manager
    requires_downtime: bool = Field(default=False, alias="requiresDowntime")
    beta: bool = False
    internal: bool = False

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def template_name(self) -> str:
        return f"{self.short_name}-{self.version}"


def load_config(path: Path = MODULE_DIR / "module-config.yaml") -> ModuleConfig:
    return ModuleConfig.model_validate(yaml.safe_load(path.read_text()))


# -- the manifest -------------------------------------------------------------------------


def render_manifest(helm: Path, config: ModuleConfig, *, chart: Path = CHART) -> list[Obj]:
    """`helm template` with the release values and the image tag = the module version."""
    result = subprocess.run(
        [
            str(helm),
            "template",
            config.short_name,
            str(chart),
            "--namespace",
            KYMA_NAMESPACE,
            "--values",
            str(MODULE_DIR / "release-values.yaml"),
            "--set",
            f"image.tag={config.version}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise ManifestError(f"helm template failed: {result.stderr.strip()}")
    return [_without_helm_labels(doc) for doc in yaml.safe_load_all(result.stdout) if doc]


def _without_helm_labels(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    labels = out.get("metadata", {}).get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    return out


def _containers(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = workload.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def check_manifest(objects: Sequence[Mapping[str, Any]], config: ModuleConfig) -> None:
    workloads = [o for o in objects if o.get("kind") in WORKLOAD_KINDS]
    # lifecycle-manager shows the readiness of the FIRST workload it finds as the module state.
    if len(workloads) != 1:
        raise ManifestError(f"a module manifest needs exactly one workload, found {len(workloads)}")
    (workload,) = workloads
    manager = config.manager
    if (workload["kind"], workload["metadata"]["name"]) != (manager.kind, manager.name):
        raise ManifestError("the one workload must be the manager named in module-config.yaml")
    tags = [str(c.get("image", "")).rpartition(":")[2] for c in _containers(workload)]
    if not tags or any(tag != config.version for tag in tags):
        raise ManifestError(f"every image tag must equal the module version {config.version}")
    if any(tag in ("latest", "main") for tag in tags):
        raise ManifestError("image tags latest and main are refused by modulectl")
    for obj in objects:
        if obj.get("kind") in FORBIDDEN_KINDS:
            raise ManifestError(f"a module manifest ships no {obj['kind']}")
    if not any(o.get("kind") == "NetworkPolicy" for o in objects):
        raise ManifestError("the module's NetworkPolicies are missing")
    for container in _containers(workload):
        names = {str(e.get("name")) for e in container.get("env", [])}
        specific = sorted(names & CLUSTER_SPECIFIC_ENV)
        if specific:
            raise ManifestError(f"cluster-specific settings in the manifest: {', '.join(specific)}")


def dump_manifest(objects: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False, explicit_start=True)


# -- what lifecycle-manager does before applying ------------------------------------------


def as_lifecycle_manager_renders(
    objects: Sequence[Mapping[str, Any]], *, owner: str, namespace: str = KYMA_NAMESPACE
) -> list[Obj]:
    """Each object as lifecycle-manager applies it (render/default_transforms.go): namespaced
    objects without a namespace get `namespace`; every object gets the managed-by, part-of and
    component (the Manifest's name) labels, the owned-by annotation (`owner`, which is
    `<kcp namespace>/<Manifest name>`) and the do-not-edit disclaimer."""
    out = []
    for raw in objects:
        obj = copy.deepcopy(dict(raw))
        metadata = obj.setdefault("metadata", {})
        if obj.get("kind") not in CLUSTER_SCOPED and not metadata.get("namespace"):
            metadata["namespace"] = namespace
        labels = metadata.get("labels") or {}
        metadata["labels"] = {
            **labels,
            MANAGED_BY_LABEL: MANAGED_BY_VALUE,
            PART_OF_LABEL: PART_OF_VALUE,
            COMPONENT_LABEL: owner.rpartition("/")[2],
        }
        annotations = metadata.get("annotations") or {}
        metadata["annotations"] = {
            **annotations,
            OWNED_BY_ANNOTATION: owner,
            DISCLAIMER_ANNOTATION: DISCLAIMER,
        }
        out.append(obj)
    return out


def as_lifecycle_manager_syncs_to_runtime(catalog_object: Mapping[str, Any]) -> Obj:
    """A KCP ModuleTemplate or ModuleReleaseMeta as lifecycle-manager copies it into a runtime
    whose Kyma may see it (beta here): into kyma-system, with the managed-by label
    (remote/moduletemplate_syncworker.go, modulereleasemeta_syncworker.go)."""
    obj = copy.deepcopy(dict(catalog_object))
    metadata = obj.setdefault("metadata", {})
    metadata["namespace"] = KYMA_NAMESPACE
    metadata["labels"] = {**(metadata.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    return obj


def runtime_kyma_marks(
    kcp_kyma: str, runtime_id: str, *, kcp_namespace: str = KCP_NAMESPACE
) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations lifecycle-manager keeps on a managed runtime's own Kyma
    `kyma-system/default` (remote/skr_context.go): the agent reads the runtime ID there."""
    labels = {
        RUNTIME_ID_LABEL: runtime_id,
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        WATCHED_BY_LABEL: MANAGED_BY_VALUE,
    }
    return labels, {OWNED_BY_ANNOTATION: f"{kcp_namespace}/{kcp_kyma}"}


# -- ModuleTemplates -------------------------------------------------------------------------


def _info(config: ModuleConfig) -> Obj:
    return {
        "repository": str(config.repository),
        "documentation": str(config.documentation),
        "icons": [{"name": i.name, "link": str(i.link)} for i in config.icons],
    }


def module_template(config: ModuleConfig) -> Obj:
    """The ModuleTemplate modulectl generates (templategenerator.go), namespaced for KCP."""
    labels = {"operator.kyma-project.io/module-name": config.short_name}
    if config.beta:
        labels["operator.kyma-project.io/beta"] = "true"
    if config.internal:
        labels["operator.kyma-project.io/internal"] = "true"
    return {
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "ModuleTemplate",
        "metadata": {
            "name": config.template_name,
            "namespace": KCP_NAMESPACE,
            "labels": labels,
            "annotations": {"operator.kyma-project.io/is-cluster-scoped": "false"},
        },
        "spec": {
            "moduleName": config.short_name,
            "version": config.version,
            "requiresDowntime": config.requires_downtime,
            "info": _info(config),
            "manager": config.manager.model_dump(),
            # Deprecated and unused at runtime (the descriptor comes from OCI), still required.
            "descriptor": {},
            "resources": [{"name": "rawManifest", "link": str(config.manifest)}],
        },
    }


def community_module_template(config: ModuleConfig) -> Obj:
    """The community-module form for clusters the control plane does not manage: a plain
    ModuleTemplate in the cluster itself whose `spec.resources` link the raw manifest, which
    the Kyma dashboard ("Community Modules → Add") or `kyma module add` installs."""
    template = module_template(config)
    template["metadata"]["namespace"] = KYMA_NAMESPACE
    template["metadata"]["labels"] = {
        "operator.kyma-project.io/module-name": config.short_name,
        "operator.kyma-project.io/community-module": "true",
    }
    return template


def check_release_meta(release_meta: Mapping[str, Any], config: ModuleConfig) -> None:
    spec = release_meta.get("spec", {})
    if release_meta.get("metadata", {}).get("name") != config.short_name:
        raise ManifestError("the ModuleReleaseMeta must be named after the module")
    if spec.get("ocmComponentName") != config.name or spec.get("moduleName") != config.short_name:
        raise ManifestError("the ModuleReleaseMeta names another module")
    versions = {c.get("version") for c in spec.get("channels", [])}
    if config.version not in versions:
        raise ManifestError(f"no channel of the ModuleReleaseMeta offers {config.version}")


# -- the command -------------------------------------------------------------------------------


def build(helm: Path, out: Path) -> list[Path]:
    config = load_config()
    objects = render_manifest(helm, config)
    check_manifest(objects, config)
    release_meta = yaml.safe_load((MODULE_DIR / "module-release-meta.yaml").read_text())
    check_release_meta(release_meta, config)
    out.mkdir(parents=True, exist_ok=True)
    written = {
        out / MANIFEST_FILE: dump_manifest(objects),
        out / f"moduletemplate-{config.template_name}.yaml": yaml.safe_dump(
            module_template(config), sort_keys=False
        ),
        out / f"community-moduletemplate-{config.template_name}.yaml": yaml.safe_dump(
            community_module_template(config), sort_keys=False
        ),
    }
    for path, text in written.items():
        path.write_text(text)
    shutil.copyfile(MODULE_DIR / "module-release-meta.yaml", out / "module-release-meta.yaml")
    return [*written, out / "module-release-meta.yaml"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.kyma_module", description=__doc__)
    parser.add_argument("--helm", type=Path, required=True, help="the helm binary")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "dist" / "module")
    args = parser.parse_args(argv)
    try:
        paths = build(args.helm, args.out)
    except ManifestError as e:
        print(f"module: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
