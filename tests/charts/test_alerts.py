"""The optional PrometheusRule: off by default; when on, every rule passes Prometheus's own rule
parser (what `promtool check rules` runs), every metric it names is in a real scrape of the
broker, every selector of every alert selects a series of a healthy broker's scrape, and every
alert has its runbook section in docs/operations.md (and every section an alert)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.clusters import Binaries
from tests.charts.promql import check_exprs, check_rules
from tests.charts.render import by_kind, render
from tests.charts.series import samples, unmatched
from tests.conftest import REPO_ROOT

BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}
RUNBOOK = REPO_ROOT / "docs" / "operations.md"
ALERTS = {
    # the alert: the metric the issue asks it to be based on
    "CompassBrokerCircuitBreakerOpen": "broker_circuit_breaker_open",
    "CompassBrokerRuntimesNeedAttention": "broker_runtimes_attention",
    "CompassBrokerEnrolmentPending": "broker_token_requests_total",
    "CompassBrokerNotReady": "broker_kyma_cache_synced",
    "CompassBrokerNoLeader": "broker_leader",
    "CompassBrokerTaskRestarts": "broker_task_restarts_total",
    "CompassBrokerFirstContactsBusy": "broker_token_requests_total",
}


def _rule(binaries: Binaries, **values: str) -> dict[str, Any]:
    objects = render(
        binaries,
        "compass-broker",
        namespace="kcp-system",
        values={**BROKER_REQUIRED, "prometheusRule.enabled": "true", **values},
    )
    (rule,) = by_kind(objects, "PrometheusRule")
    return rule


def _rules_file(rule: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def test_no_prometheus_rule_by_default(binaries: Binaries) -> None:
    objects = render(binaries, "compass-broker", namespace="kcp-system", values=BROKER_REQUIRED)
    assert by_kind(objects, "PrometheusRule") == []


def test_the_rules_parse_as_prometheus_parses_them(binaries: Binaries, tmp_path: Path) -> None:
    rule = _rule(binaries, **{"prometheusRule.labels.release": "kube-prometheus"})
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    parsed = check_rules(_rules_file(rule, tmp_path))
    assert {r["alert"]: ALERTS[r["alert"]] in r["metrics"] for r in parsed} == dict.fromkeys(
        ALERTS, True
    )
    for r in parsed:
        assert 'job="compass-broker"' in r["expr"]
        assert 'namespace="kcp-system"' in r["expr"]


def test_the_parser_refuses_a_broken_rule(binaries: Binaries, tmp_path: Path) -> None:
    rule = _rule(binaries)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "max(broker_leader"
    with pytest.raises(AssertionError, match="do not parse"):
        check_rules(_rules_file(rule, tmp_path))
    rule = _rule(binaries)
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    with pytest.raises(AssertionError, match="do not parse"):
        check_rules(_rules_file(rule, tmp_path))
    with pytest.raises(AssertionError, match="do not parse"):
        check_exprs(["sum(rate(broker_leader[5m])"])


def test_thresholds_are_values(binaries: Binaries) -> None:
    rule = _rule(
        binaries,
        **{"prometheusRule.breakerOpenFor": "3m", "prometheusRule.enrolmentPendingFor": "2h"},
    )
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert rules["CompassBrokerCircuitBreakerOpen"]["for"] == "3m"
    assert rules["CompassBrokerEnrolmentPending"]["for"] == "2h"


def test_every_alert_has_its_runbook_section_and_every_section_an_alert(
    binaries: Binaries,
) -> None:
    rules = _rule(binaries)["spec"]["groups"][0]["rules"]
    sections = set(re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.MULTILINE))
    assert {r["alert"] for r in rules} == sections
    for r in rules:
        url = r["annotations"]["runbook_url"]
        assert url.endswith("docs/operations.md#" + r["alert"].lower())


def test_every_metric_the_rules_name_is_in_a_real_scrape(
    binaries: Binaries,
    tmp_path: Path,
    broker_scrape: set[str],
) -> None:
    parsed = check_rules(_rules_file(_rule(binaries), tmp_path))
    named = {name for r in parsed for name in r["metrics"]}
    assert named >= set(ALERTS.values())
    missing = sorted(named - broker_scrape)
    assert not missing, f"the rules name metrics the broker does not export: {missing}"


# The labels Prometheus adds to every series it scrapes through the chart's ServiceMonitor: the
# Service's name as `job`, the release namespace (the rules are rendered into kcp-system).
TARGET = {"job": "compass-broker", "namespace": "kcp-system", "instance": "10.0.0.7:8080"}


def test_every_alert_selects_series_of_a_healthy_brokers_scrape(
    binaries: Binaries, tmp_path: Path, broker_exposition: str
) -> None:
    """Each alert's data exists before anything goes wrong: a counter's first restart or refusal
    is an increase only when its series was already there at 0."""
    parsed = check_rules(_rules_file(_rule(binaries), tmp_path))
    scrape = samples(broker_exposition, TARGET)
    empty = {r["alert"]: unmatched(r["expr"], r["metrics"], scrape) for r in parsed}
    assert {alert: selectors for alert, selectors in empty.items() if selectors} == {}
    restarts = {x.labels["task"] for x in scrape if x.name == "broker_task_restarts_total"}
    assert {"kyma-watch", "mapping-watch", "lease", "sweep", "connection-check"} <= restarts


def test_the_selector_evaluator_finds_what_selects_nothing() -> None:
    exposition = (
        "# TYPE broker_task_restarts counter\n"
        "# TYPE broker_leader gauge\n"
        "broker_leader 1.0\n"
        "# TYPE broker_token_requests counter\n"
        'broker_token_requests_total{outcome="issued"} 0.0\n'
    )
    scrape = samples(exposition, TARGET)
    expr = (
        'sum(increase(broker_task_restarts_total{job="compass-broker"}[15m])) > 3 '
        'or broker_leader{namespace="kcp-system", job=~"compass-.*"} '
        'or broker_token_requests_total{outcome!="issued"} '
        'or broker_token_requests_total{outcome=~"iss"}'
    )
    names = ["broker_task_restarts_total", "broker_leader", "broker_token_requests_total"]
    assert unmatched(expr, names, scrape) == [
        'broker_task_restarts_total{job="compass-broker"}',  # declared, but no sample
        'broker_token_requests_total{outcome!="issued"}',
        'broker_token_requests_total{outcome=~"iss"}',  # anchored: "iss" is not "issued"
    ]
    assert unmatched('broker_leader{job="other"}', ["broker_leader"], scrape) == [
        'broker_leader{job="other"}'
    ]
    assert unmatched("absent(broker_leader)", ["broker_leader"], scrape) == []
