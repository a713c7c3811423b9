"""The optional PrometheusRule: off by default; when on, every rule passes Prometheus's own rule
parser (what `promtool check rules` runs), every metric it names is in a real scrape of the
broker, and every alert has its runbook section in docs/operations.md (and every section an
alert)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.clusters import Binaries
from tests.charts.promql import check_exprs, check_rules
from tests.charts.render import by_kind, render
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
