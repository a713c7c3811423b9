"""Both charts' scheduling and pod values (priorityClassName, podAnnotations, affinity,
topologySpreadConstraints), the agent's metrics monitor and the charts' NOTES, rendered with the
real helm: the broker's spread over nodes is the default of its `affinity` value (no longer
hard-coded), a value may name the release, and the pod spec they make is one a real API server
admits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devenv.clusters import Binaries, TestCluster
from tests.charts.render import CHARTS, HelmError, apply, by_kind, helm, pods_from_templates
from tests.conftest import NamespaceFactory

REQUIRED = {
    "compass-broker": {"director": {"url": "https://director.example.test/graphql"}},
    "compass-agent": {
        "broker": {"url": "https://compass-broker.example.test"},
        "testing": {"anyNamespace": True},
    },
}
SELECTOR = {
    "compass-broker": {"app.kubernetes.io/name": "compass-broker"},
    "compass-agent": {"app.kubernetes.io/name": "compass-agent"},
}
SPREAD = [
    {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "{{ .Release.Name }}"}},
    }
]
ON_LINUX = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                    ]
                }
            ]
        }
    }
}


def render(
    binaries: Binaries,
    chart: str,
    tmp_path: Path,
    values: dict[str, Any] | None = None,
    *,
    namespace: str = "kyma-system",
) -> list[dict[str, Any]]:
    """The chart with a values file (structured values, nulls included, as an operator writes
    them), release name `rel`."""
    file = tmp_path / f"{chart}-values.yaml"
    file.write_text(yaml.safe_dump({**REQUIRED[chart], **(values or {})}))
    out = helm(binaries, "template", "rel", str(CHARTS / chart), "-n", namespace, "-f", str(file))
    return [doc for doc in yaml.safe_load_all(out) if doc]


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def pod_annotations(objects: list[dict[str, Any]]) -> dict[str, str] | None:
    (deployment,) = by_kind(objects, "Deployment")
    annotations: dict[str, str] | None = deployment["spec"]["template"]["metadata"].get(
        "annotations"
    )
    return annotations


def test_the_brokers_replicas_spread_over_nodes_by_the_default_affinity(
    binaries: Binaries, tmp_path: Path
) -> None:
    spec = pod_spec(render(binaries, "compass-broker", tmp_path))
    assert spec["affinity"] == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        # The Deployment's own selector, the release's name filled in.
                        "labelSelector": {
                            "matchLabels": {
                                "app.kubernetes.io/name": "compass-broker",
                                "app.kubernetes.io/instance": "rel",
                            }
                        },
                    },
                }
            ]
        }
    }
    for absent in ("priorityClassName", "topologySpreadConstraints"):
        assert absent not in spec


def test_the_agent_has_no_scheduling_constraint_by_default(
    binaries: Binaries, tmp_path: Path
) -> None:
    objects = render(binaries, "compass-agent", tmp_path)
    spec = pod_spec(objects)
    for absent in ("priorityClassName", "affinity", "topologySpreadConstraints"):
        assert absent not in spec
    assert pod_annotations(objects) is None


@pytest.mark.parametrize("chart", ["compass-broker", "compass-agent"])
def test_scheduling_and_pod_values_reach_the_pod(
    binaries: Binaries, chart: str, tmp_path: Path
) -> None:
    objects = render(
        binaries,
        chart,
        tmp_path,
        {
            "priorityClassName": "kyma-system",
            "podAnnotations": {"example.com/team": "connectivity"},
            # Helm merges maps with the default: null drops the broker's anti-affinity.
            "affinity": ON_LINUX | ({"podAntiAffinity": None} if chart == "compass-broker" else {}),
            "topologySpreadConstraints": SPREAD,
        },
    )
    spec = pod_spec(objects)
    assert spec["priorityClassName"] == "kyma-system"
    assert spec["affinity"] == ON_LINUX
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": {"app.kubernetes.io/instance": "rel"}}
    assert pod_annotations(objects) == {"example.com/team": "connectivity"}


def test_the_brokers_own_istio_annotation_is_kept_beside_pod_annotations(
    binaries: Binaries, tmp_path: Path
) -> None:
    objects = render(
        binaries,
        "compass-broker",
        tmp_path,
        {
            "istio": {"enabled": True, "host": "compass-broker.example.test"},
            "podAnnotations": {"example.com/team": "connectivity"},
        },
    )
    assert pod_annotations(objects) == {
        "example.com/team": "connectivity",
        "sidecar.istio.io/inject": "true",
    }


def test_an_empty_affinity_drops_the_brokers_spread(binaries: Binaries, tmp_path: Path) -> None:
    spec = pod_spec(render(binaries, "compass-broker", tmp_path, {"affinity": None}))
    assert "affinity" not in spec


@pytest.mark.parametrize("chart", ["compass-broker", "compass-agent"])
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"priorityClassName": "Not A Name"}, "/priorityClassName"),
        ({"podAnnotations": {"example.com/replicas": 2}}, "/podAnnotations/example.com~1replicas"),
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "/topologySpreadConstraints/0"),
        ({"affinity": ["podAntiAffinity"]}, "/affinity"),
    ],
)
def test_bad_scheduling_values_fail_naming_the_field(
    binaries: Binaries, chart: str, values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(HelmError, match=message):
        render(binaries, chart, tmp_path, values)


def test_the_agents_metrics_get_a_service_and_a_monitor_only_when_asked(
    binaries: Binaries, tmp_path: Path
) -> None:
    assert by_kind(render(binaries, "compass-agent", tmp_path), "ServiceMonitor") == []
    assert by_kind(render(binaries, "compass-agent", tmp_path), "Service") == []
    objects = render(
        binaries, "compass-agent", tmp_path, {"serviceMonitor": {"enabled": True, "interval": "1m"}}
    )
    (service,) = by_kind(objects, "Service")
    (monitor,) = by_kind(objects, "ServiceMonitor")
    (deployment,) = by_kind(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = pod_spec(objects)["containers"]
    # The Service reaches the agent's pod on its health port, where /metrics is served ...
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    # ... and the monitor scrapes that Service: job "compass-agent" (the Service's name).
    assert service["metadata"]["name"] == "compass-agent"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": port["name"], "path": "/metrics", "interval": "1m"}
    ]


@pytest.mark.parametrize("chart", ["compass-broker", "compass-agent"])
def test_a_real_api_server_admits_the_pod_these_values_make(
    binaries: Binaries,
    chart: str,
    control_plane: TestCluster,
    namespace_factory: NamespaceFactory,
    tmp_path: Path,
) -> None:
    """Field names and shapes are the API server's to judge: a typo inside `affinity` passes
    the chart's schema (an open object) but not this."""
    priority = f"compass-test-{chart}"
    scheduling = client.SchedulingV1Api(control_plane.api_client)
    scheduling.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name=priority), value=1000)
    )
    try:
        ns = namespace_factory(control_plane)
        objects = render(
            binaries,
            chart,
            tmp_path,
            {
                "priorityClassName": priority,
                "podAnnotations": {"example.com/team": "connectivity"},
                "affinity": ON_LINUX,
                "topologySpreadConstraints": SPREAD,
            },
            namespace=ns,
        )
        apply(control_plane, by_kind(objects, "ServiceAccount"), namespace=ns)
        pods = apply(control_plane, pods_from_templates(objects), namespace=ns)
        (pod,) = pods.objects
        assert pod["spec"]["priorityClassName"] == priority
        assert pod["spec"]["priority"] == 1000
        assert pod["spec"]["topologySpreadConstraints"][0]["labelSelector"] == {
            "matchLabels": {"app.kubernetes.io/instance": "rel"}
        }
    finally:
        scheduling.delete_priority_class(priority)


def notes(binaries: Binaries, chart: str, namespace: str, *sets: str) -> str:
    """What `helm install` prints after installing (a client-side dry run: no cluster)."""
    args = [arg for value in sets for arg in ("--set", value)]
    out = helm(
        binaries, "install", "rel", str(CHARTS / chart), "-n", namespace, "--dry-run=client", *args
    )
    return out[out.index("NOTES:") :]


def test_the_brokers_notes_name_its_secret_its_crd_step_and_the_procedures(
    binaries: Binaries,
) -> None:
    text = notes(
        binaries,
        "compass-broker",
        "kcp-system",
        "director.url=https://director.example.test/graphql",
        "director.credentialsSecret=director-client",
    )
    assert "kubectl -n kcp-system exec deploy/compass-broker -- compass-broker --check-config" in (
        text
    )
    assert "Secret director-client (key credentials.yaml" in text
    assert "kubectl apply --server-side --force-conflicts -f charts/compass-broker/crds/" in text
    assert "docs/operations.md" in text
    assert "{{" not in text


def test_the_agents_notes_say_where_to_look(binaries: Binaries) -> None:
    text = notes(binaries, "compass-agent", "kyma-system", "broker.url=https://broker.example.test")
    assert "kubectl -n kyma-system get secret compass-agent-configuration" in text
    assert "on the Kyma kyma-system/default, or on that Secret" in text
    assert "runtime ID comes from" in text
    byoc = notes(
        binaries,
        "compass-agent",
        "kyma-system",
        "broker.url=https://broker.example.test",
        "runtimeID=0b8a1c52-4a8b-4c51-9d5e-6f2d3a1b7c90",
    )
    assert "runtime ID comes from" not in byoc
