"""The Grafana dashboard in the broker chart: rendered by real helm only when asked for, valid
JSON, every query parsed as Prometheus parses it and narrowed to the job and namespace chosen,
and every metric it queries is in a real scrape of the broker (a renamed metric breaks this
test, not the dashboard in production)."""

from __future__ import annotations

import json
import re
from typing import Any

from control_plane_broker.metrics import Metrics
from devenv.clusters import Binaries
from tests.charts.promql import check_exprs
from tests.charts.render import by_kind, render

BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}
METRIC_SELECTOR = re.compile(r"\bbroker_[a-z_]+(\{[^}]*\})?")


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


# Grafana's variables, as Prometheus would get them.
GRAFANA_VARIABLES = {"$job": ".*", "$namespace": ".*", "$__rate_interval": "5m"}


def _dashboard(binaries: Binaries) -> dict[str, Any]:
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
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def _queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Panel title: its queries, Grafana's variables filled in."""
    out: dict[str, list[str]] = {}
    for panel in dashboard["panels"]:
        exprs = []
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            exprs.append(expr)
        out[panel["title"]] = exprs
    return out


def test_dashboard_renders_as_labelled_json_whose_queries_parse(binaries: Binaries) -> None:
    dashboard = _dashboard(binaries)
    queries = _queries(dashboard)
    parsed = check_exprs([e for exprs in queries.values() for e in exprs])
    queried = {name for result in parsed for name in result["metrics"]}
    for needed in (
        "broker_runtimes_by_connection_state",
        "broker_connection_report_oldest_age_seconds",
        "broker_token_requests_total",
        "broker_token_request_seconds_bucket",  # latency
        "broker_director_calls_in_flight",  # Director admission
        "broker_director_calls_waiting",
        "broker_director_booked_ahead_seconds",
        "broker_leader",
        "broker_kyma_cache_synced",  # caches
        "broker_kymas_cached",
        "broker_task_restarts_total",
        "broker_first_contacts_waiting",
    ):
        assert needed in queried, f"the dashboard does not show {needed}"
    [busy] = [e for title, exprs in queries.items() if title.startswith("503") for e in exprs]
    assert "first-contacts-busy" in busy
    assert "compass-unavailable" in busy
    # Every query is narrowed to the chosen job and namespace.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"job", "namespace"} <= set(variables)
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for selector in METRIC_SELECTOR.findall(target["expr"]):
                assert 'job=~"$job"' in selector, (panel["title"], target["expr"])
                assert 'namespace=~"$namespace"' in selector, (panel["title"], target["expr"])


def test_every_metric_the_dashboard_queries_is_in_a_real_scrape(
    binaries: Binaries, broker_scrape: set[str]
) -> None:
    queries = _queries(_dashboard(binaries))
    parsed = check_exprs([e for exprs in queries.values() for e in exprs])
    queried = {name for result in parsed for name in result["metrics"]}
    unknown = sorted(queried - broker_scrape)
    assert not unknown, f"the dashboard queries metrics the broker does not export: {unknown}"
    # The registry agrees with the scrape (the scrape adds the collectors fed at run time).
    assert exported_metric_names() <= broker_scrape


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
