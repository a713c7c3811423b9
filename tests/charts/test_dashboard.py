"""The Grafana dashboard in the broker chart: rendered by real helm only when asked for, valid
JSON, and every metric it queries is one the broker exports (a renamed metric breaks this test,
not the dashboard in production)."""

from __future__ import annotations

import json
import re
from typing import Any

from control_plane_broker.metrics import Metrics
from devenv.clusters import Binaries
from tests.charts.render import by_kind, render

BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}
METRIC = re.compile(r"\b(broker_[a-z_]+)\b")


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
        }.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def dashboard_configmaps(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        cm for cm in by_kind(objects, "ConfigMap") if cm["metadata"]["name"].endswith("-dashboard")
    ]


def test_dashboard_is_off_by_default(binaries: Binaries) -> None:
    objects = render(binaries, "compass-broker", namespace="kcp-system", values=BROKER_REQUIRED)
    assert dashboard_configmaps(objects) == []


def test_dashboard_renders_as_labelled_json_querying_only_exported_metrics(
    binaries: Binaries,
) -> None:
    objects = render(
        binaries,
        "compass-broker",
        namespace="kcp-system",
        values={**BROKER_REQUIRED, "grafanaDashboard.enabled": "true"},
    )
    [configmap] = dashboard_configmaps(objects)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "kcp-system"
    [text] = configmap["data"].values()
    dashboard = json.loads(text)
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {name for expr in exprs for name in METRIC.findall(expr)}
    for needed in (
        "broker_runtimes_by_connection_state",
        "broker_connection_report_oldest_age_seconds",
        "broker_token_requests_total",
    ):
        assert needed in queried, f"the dashboard does not show {needed}"
    unknown = sorted(queried - exported_metric_names())
    assert not unknown, f"the dashboard queries metrics the broker does not export: {unknown}"
    assert any("compass-unavailable" in expr for expr in exprs), "no 503 rate panel"


def test_the_metric_check_catches_a_name_the_broker_does_not_export() -> None:
    assert "broker_token_requests_total" in exported_metric_names()
    assert "broker_runtimes_by_connection_state" in exported_metric_names()
    assert "broker_token_request_seconds_bucket" in exported_metric_names()
    assert "broker_tokens_total" not in exported_metric_names()


def test_the_xfcc_deny_list_is_mounted_as_a_directory_in_xfcc_mode(binaries: Binaries) -> None:
    objects = render(
        binaries,
        "compass-broker",
        namespace="kcp-system",
        values={
            **BROKER_REQUIRED,
            "identity.mode": "xfcc",
            "identity.xfccDenyListConfigMap": "revoked-certificates",
            "istio.enabled": "true",
            "istio.host": "compass-broker.example.test",
            "istio.ingressGateway.namespace": "istio-system",
            "istio.ingressGateway.podLabels.istio": "ingressgateway",
        },
    )
    [deployment] = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BROKER_XFCC_DENY_LIST_FILE"] == "/etc/compass-broker/deny-list/deny-list"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "deny-list"]
    assert "subPath" not in mount  # a subPath mount never sees the ConfigMap change
    [volume] = [v for v in pod["volumes"] if v["name"] == "deny-list"]
    assert volume["configMap"]["name"] == "revoked-certificates"
