"""The fleet gauges: every runtime's connection health, computed from the mappings when scraped.

Holds: nothing is counted as it happens, so the gauges are never stale and need no bookkeeping;
`report_rules.fleet` computes them over the watch-fed mapping view at scrape time. Labels are
fixed words (every connection state, `unknown`, three attention reasons): never IDs. This module
imports no broker module at run time, so `metrics` may register the collector without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # report_rules imports the registration package, which imports `metrics`
    from control_plane_broker.connections.report_rules import Fleet


class FleetCollector(Collector):
    """Gauges over every mapping, computed when scraped (never stale, no bookkeeping)."""

    def __init__(self) -> None:
        self.compute: Callable[[], Fleet] | None = None

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families(None))

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families(self.compute() if self.compute is not None else None))

    def _families(self, view: Fleet | None) -> Iterator[GaugeMetricFamily]:
        by_state = GaugeMetricFamily(
            "broker_runtimes_by_connection_state",
            "Runtimes (mappings) by the connection state last reported; `unknown`: none yet.",
            labels=["state"],
        )
        oldest = GaugeMetricFamily(
            "broker_connection_report_oldest_age_seconds",
            "Age of the oldest recorded last report over all runtimes that reported (the record "
            "is refreshed every BROKER_REPORT_REFRESH_SECONDS while nothing changes).",
        )
        attention = GaugeMetricFamily(
            "broker_runtimes_attention",
            "Runtimes flagged: reports-stale, not-connected-after-token, revoked.",
            labels=["reason"],
        )
        if view is not None:
            for state, count in sorted(view.by_state.items()):
                by_state.add_metric([state], count)
            oldest.add_metric([], view.oldest_report_age or 0.0)
            attention.add_metric(["reports-stale"], view.reports_stale)
            attention.add_metric(["not-connected-after-token"], view.not_connected_after_token)
            attention.add_metric(["revoked"], view.revoked)
        yield by_state
        yield oldest
        yield attention
