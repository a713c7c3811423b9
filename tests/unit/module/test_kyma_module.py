"""`devenv.kyma_module`: the rules of a module manifest and what lifecycle-manager does to it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from devenv import kyma_module as km

CONFIG = km.load_config()


def deployment(*images: str, env: tuple[str, ...] = ()) -> dict[str, Any]:
    containers = [
        {"name": f"c{i}", "image": image, "env": [{"name": n, "value": "x"} for n in env]}
        for i, image in enumerate(images)
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "compass-agent", "namespace": "kyma-system"},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


NETPOL = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "n"}}
GOOD = [deployment(f"registry.example/compass-agent:{CONFIG.version}"), NETPOL]


def test_a_good_manifest_passes() -> None:
    km.check_manifest(GOOD, CONFIG)


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([NETPOL], "exactly one workload"),
        ([*GOOD, {**deployment("x:1"), "kind": "StatefulSet"}], "exactly one workload"),
        ([deployment("registry.example/compass-agent:9.9.9"), NETPOL], "image tag"),
        ([deployment("registry.example/compass-agent:latest"), NETPOL], "image tag"),
        ([deployment(f"r/a:{CONFIG.version}", "r/sidecar:main"), NETPOL], "image tag"),
        ([GOOD[0]], "NetworkPolicies"),
        ([*GOOD, {"kind": "Namespace", "metadata": {"name": "kyma-system"}}], "no Namespace"),
        ([*GOOD, {"kind": "Secret", "metadata": {"name": "s"}}], "no Secret"),
        (
            [deployment(f"r/a:{CONFIG.version}", env=("AGENT_BROKER_URL",)), NETPOL],
            "cluster-specific settings in the manifest: AGENT_BROKER_URL",
        ),
        (
            [deployment(f"r/a:{CONFIG.version}", env=("AGENT_RUNTIME_ID",)), NETPOL],
            "AGENT_RUNTIME_ID",
        ),
    ],
)
def test_a_manifest_breaking_a_rule_is_refused(objects: list[Any], message: str) -> None:
    with pytest.raises(km.ManifestError, match=message):
        km.check_manifest(objects, CONFIG)


def test_the_workload_must_be_the_manager() -> None:
    other = copy.deepcopy(GOOD)
    other[0]["metadata"]["name"] = "something-else"
    with pytest.raises(km.ManifestError, match="manager"):
        km.check_manifest(other, CONFIG)


def test_lifecycle_manager_defaults_the_namespace_and_adds_its_marks() -> None:
    objects = [
        {"kind": "ServiceAccount", "metadata": {"name": "sa"}},
        {"kind": "Role", "metadata": {"name": "r", "namespace": "elsewhere", "labels": {"a": "b"}}},
        {"kind": "ClusterRole", "metadata": {"name": "cr"}},
    ]
    rendered = km.as_lifecycle_manager_renders(objects, owner="kcp-system/rt-1-compass-agent")
    sa, role, cluster_role = rendered
    assert sa["metadata"]["namespace"] == "kyma-system"
    assert role["metadata"]["namespace"] == "elsewhere"  # only missing namespaces are set
    assert "namespace" not in cluster_role["metadata"]
    for obj in rendered:
        assert obj["metadata"]["labels"][km.MANAGED_BY_LABEL] == "kyma"
        assert obj["metadata"]["labels"][km.PART_OF_LABEL] == "Kyma"
        assert obj["metadata"]["labels"][km.COMPONENT_LABEL] == "rt-1-compass-agent"
        annotations = obj["metadata"]["annotations"]
        assert annotations[km.OWNED_BY_ANNOTATION] == "kcp-system/rt-1-compass-agent"
        assert annotations[km.DISCLAIMER_ANNOTATION].startswith("DO NOT EDIT")
    assert role["metadata"]["labels"]["a"] == "b"
    assert objects[0]["metadata"] == {"name": "sa"}  # the input is not changed


def test_module_template_has_what_modulectl_writes() -> None:
    template = km.module_template(CONFIG)
    assert template["metadata"]["name"] == f"compass-agent-{CONFIG.version}"
    assert template["metadata"]["namespace"] == "kcp-system"
    assert template["metadata"]["labels"]["operator.kyma-project.io/module-name"] == (
        "compass-agent"
    )
    spec = template["spec"]
    assert spec["moduleName"] == "compass-agent"
    assert spec["version"] == CONFIG.version
    assert spec["manager"]["kind"] == "Deployment"
    assert spec["resources"] == [{"name": "rawManifest", "link": str(CONFIG.manifest)}]
    assert "data" not in spec  # no default CR, so no CRD in the manifest either
    community = km.community_module_template(CONFIG)
    assert community["metadata"]["namespace"] == "kyma-system"
    assert community["spec"]["resources"] == spec["resources"]


def test_release_meta_in_the_repo_offers_the_configured_version() -> None:
    meta = yaml.safe_load((km.MODULE_DIR / "module-release-meta.yaml").read_text())
    km.check_release_meta(meta, CONFIG)
    stale = copy.deepcopy(meta)
    stale["spec"]["channels"] = [{"channel": "regular", "version": "0.0.1"}]
    with pytest.raises(km.ManifestError, match="no channel"):
        km.check_release_meta(stale, CONFIG)
    renamed = copy.deepcopy(meta)
    renamed["metadata"]["name"] = "other"
    with pytest.raises(km.ManifestError, match="named after"):
        km.check_release_meta(renamed, CONFIG)


def test_the_manifest_url_names_the_version() -> None:
    assert f"/{CONFIG.version}/" in str(CONFIG.manifest)
