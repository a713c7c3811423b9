"""Counters whose label values are known have their series at 0 from the start: a counter's first
increment is an increase Prometheus sees only when the series was scraped before it."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from control_plane_broker.errors import EnrolmentPending, FirstContactsBusy
from control_plane_broker.metrics import REPORT_OUTCOMES, TOKEN_OUTCOMES, Metrics


def series(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_every_token_and_report_outcome_is_at_zero_before_any_request() -> None:
    metrics = Metrics()
    tokens = series(metrics, "broker_token_requests_total")
    assert tokens == {(("outcome", outcome),): 0.0 for outcome in TOKEN_OUTCOMES}
    # what the alerts select, among them
    assert {"issued", EnrolmentPending.slug, FirstContactsBusy.slug} <= set(TOKEN_OUTCOMES)
    reports = series(metrics, "broker_connection_reports_total")
    assert reports == {(("outcome", outcome),): 0.0 for outcome in REPORT_OUTCOMES}
    assert {"recorded", "unchanged", "rate-limited"} <= set(REPORT_OUTCOMES)


def test_a_task_has_its_restart_series_from_its_start() -> None:
    metrics = Metrics()
    assert series(metrics, "broker_task_restarts_total") == {}
    metrics.on_task_started("kyma-watch")
    metrics.on_task_started("sweep")
    metrics.on_task_restarted("sweep")
    assert series(metrics, "broker_task_restarts_total") == {
        (("task", "kyma-watch"),): 0.0,
        (("task", "sweep"),): 1.0,
    }
