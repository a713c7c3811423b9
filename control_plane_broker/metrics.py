"""Prometheus metrics on the broker's own registry (no global default registry, so tests and
several apps in one process stay apart). Labels are fixed, low-cardinality words: never IDs.

Holds: a counter whose label values are known in advance has a series at 0 for each from the
start (every outcome of the token and report endpoints; every background task from its start):
`increase()` and `rate()` see a counter's first increment only when its series existed before
it, and an alert on a series that does not exist yet can never fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control_plane_broker.connections.fleet_gauges import FleetCollector
from control_plane_broker.errors import BrokerError

if TYPE_CHECKING:  # the registration package imports this module: no import back at run time
    from control_plane_broker.connections.report_rules import Fleet
    from control_plane_broker.overload.capacity_schedule import DirectorLoad


def problem_slugs() -> list[str]:
    """Every problem type an endpoint can answer with: the slugs of the whole error tree."""
    slugs: set[str] = set()
    pending: list[type[BrokerError]] = [BrokerError]
    while pending:
        cls = pending.pop()
        slugs.add(cls.slug)
        pending.extend(cls.__subclasses__())
    return sorted(slugs)


TOKEN_OUTCOMES = ("issued", *problem_slugs())
REPORT_OUTCOMES = ("recorded", "unchanged", *problem_slugs())


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.token_requests = Counter(
            "broker_token_requests_total", "Token requests by outcome.", ["outcome"], registry=r
        )
        for outcome in TOKEN_OUTCOMES:
            self.token_requests.labels(outcome)
        self.identity_failures = Counter(
            "broker_identity_failures_total",
            "Identity checks that failed, by mode and reason.",
            ["mode", "reason"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "broker_circuit_breaker_open",
            "1 while the Director breaker refuses calls (open, or half-open with its probe out), "
            "judged at scrape time.",
            registry=r,
        )
        # When the outage was noticed, to the moment: a scrape of the gauge above says only
        # that it happened since the scrape before.
        self.breaker_opened_at = Gauge(
            "broker_circuit_breaker_opened_timestamp_seconds",
            "Unix time the Director breaker last opened (0: never).",
            registry=r,
        )
        # The broker's own credentials refused is Compass unavailable to every runtime at once.
        self.credentials_refused = Counter(
            "broker_director_credentials_refused_total",
            "Answers of Director's OAuth token endpoint refusing the broker's credentials "
            "(HTTP 400, 401, 403).",
            registry=r,
        )
        self.credentials_ok = Gauge(
            "broker_director_credentials_ok",
            "0 from a refusal of the broker's credentials by Director's OAuth token endpoint "
            "until it issues a token again; 1 otherwise (also before the first token).",
            registry=r,
        )
        self.credentials_ok.set(1)
        self.registrations = Counter(
            "broker_registrations_total",
            "Registration outcomes (registered, found, adopted).",
            ["outcome"],
            registry=r,
        )
        self.unregistrations = Counter(
            "broker_unregistrations_total",
            "Runtimes unregistered by the reconciler.",
            ["reason"],
            registry=r,
        )
        self.runtimes_lost = Counter(
            "broker_compass_runtimes_lost_total",
            "Recorded Compass runtimes that Director showed gone (unregistered behind the "
            "broker's back); each is registered again on its next token request.",
            registry=r,
        )
        self.labels_synced = Counter(
            "broker_director_labels_synced_total", "Director labels written.", registry=r
        )
        self.uncertain_answers = Counter(
            "broker_director_uncertain_answers_total",
            "Answers to writing calls that do not prove what Director wrote (its internal "
            "error, a lost answer, a field failing after the commit), by operation.",
            ["operation"],
            registry=r,
        )
        self.kymas_cached = Gauge(
            "broker_kymas_cached", "Kyma CRs in the broker's watch cache.", registry=r
        )
        self.cache_synced = Gauge(
            "broker_kyma_cache_synced", "1 once the Kyma cache has synced.", registry=r
        )
        self.leader = Gauge("broker_leader", "1 while this replica is the leader.", registry=r)
        self.task_restarts = Counter(
            "broker_task_restarts_total",
            "Background tasks restarted after they failed, by task.",
            ["task"],
            registry=r,
        )
        self.kube_requests = Counter(
            "broker_kube_requests_total",
            "Requests to the KCP API server, by verb (watch streams count once).",
            ["verb"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "broker_event_loop_lag_seconds",
            "How late the event loop ran the latest of its twice-a-second timer ticks.",
            registry=r,
        )
        self.deferred_writes = Gauge(
            "broker_deferred_writes_pending",
            "KCP writes no answer waits for (statuses after a token, Events), waiting while "
            "requests wait for Director.",
            registry=r,
        )
        self.first_contacts_waiting = Gauge(
            "broker_first_contacts_waiting",
            "Requests of runtimes not proven recently, waiting in front of the app for a place "
            "(BROKER_FIRST_CONTACTS_IN_PROGRESS).",
            registry=r,
        )
        self.request_seconds = Histogram(
            "broker_token_request_seconds", "Duration of token requests.", registry=r
        )
        self.connection_reports = Counter(
            "broker_connection_reports_total",
            "Connection reports by outcome: recorded (written to the mapping), unchanged (nothing "
            "to write), or the problem type it was refused with.",
            ["outcome"],
            registry=r,
        )
        for outcome in REPORT_OUTCOMES:
            self.connection_reports.labels(outcome)
        self.revoked_refusals = Counter(
            "broker_revoked_refusals_total",
            "Requests of proven but revoked runtimes refused, by endpoint (token, connection) and "
            "source (annotation, deny-list).",
            ["endpoint", "source"],
            registry=r,
        )
        self._fleet = FleetCollector()
        r.register(self._fleet)
        self._director = DirectorCollector()
        r.register(self._director)

    def watch_fleet(self, compute: Callable[[], Fleet]) -> None:
        """The fleet gauges come from `compute` (over the watch-fed view), called at scrape time."""
        self._fleet.compute = compute

    def watch_kymas(self, count: Callable[[], int]) -> None:
        """The Kymas in the watch cache, counted at scrape time."""
        self.kymas_cached.set_function(count)

    def watch_first_contacts(self, compute: Callable[[], int]) -> None:
        """Requests parked by the first-contact limit in front of the app
        (`api/first_contact_middleware.py`), read at scrape."""
        self.first_contacts_waiting.set_function(compute)

    def watch_director(self, compute: Callable[[], DirectorLoad]) -> None:
        """The Director load gauges come from `compute`, called at scrape time."""
        self._director.compute = compute

    def on_task_started(self, task: str) -> None:
        """The task's restart series exists, at 0, from its first start."""
        self.task_restarts.labels(task)

    def on_task_restarted(self, task: str) -> None:
        self.task_restarts.labels(task).inc()

    def on_kube_request(self, verb: str, _status: int | None) -> None:
        self.kube_requests.labels(verb).inc()

    def watch_breaker(self, refusing: Callable[[], bool]) -> None:
        """The breaker gauge comes from `refusing`, asked at scrape time: the breaker's state
        changes only when a call arrives, and a gauge set then stayed 1 long after the open
        period ended when no call came."""
        self.breaker_state.set_function(lambda: 1.0 if refusing() else 0.0)

    def on_credentials_verdict(self, accepted: bool) -> None:
        """Director's OAuth token endpoint issued a token (True) or refused the credentials."""
        if not accepted:
            self.credentials_refused.inc()
        self.credentials_ok.set(1 if accepted else 0)

    def on_breaker_state(self, state: str) -> None:
        if state == "open":
            self.breaker_opened_at.set_to_current_time()


class DirectorCollector(Collector):
    """Director load gauges, read from the Director limiter when scraped: whether calls wait
    for the broker's slots (the broker is the limit) or the capacity schedule is reserved far
    ahead (Director is)."""

    def __init__(self) -> None:
        self.compute: Callable[[], DirectorLoad] | None = None

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.compute() if self.compute is not None else None))

    def _families(self, snap: DirectorLoad | None) -> Iterator[Metric]:
        families = {
            "in_flight": GaugeMetricFamily(
                "broker_director_calls_in_flight", "Director calls holding one of the slots."
            ),
            "waiting": GaugeMetricFamily(
                "broker_director_calls_waiting",
                "Admitted Director calls waiting for a slot (BROKER_DIRECTOR_MAX_CONCURRENCY).",
            ),
            "call_seconds": GaugeMetricFamily(
                "broker_director_call_seconds_estimate",
                "The capacity schedule's moving estimate of one Director call, slot held to "
                "released.",
            ),
            "reserved_ahead_seconds": GaugeMetricFamily(
                "broker_director_booked_ahead_seconds",
                "How far ahead Director's capacity is reserved (the wait a new runtime is told).",
            ),
            "reservations": GaugeMetricFamily(
                "broker_director_tickets",
                "Deferred requests holding a reservation (503 capacity-booked, not back yet).",
            ),
            "shift_seconds": GaugeMetricFamily(
                "broker_director_calendar_shift_seconds",
                "How far the reservations moved back because Director served slower than they "
                "were made for (0 when no reservation is held).",
            ),
        }
        for name, family in families.items():
            if snap is not None:
                family.add_metric([], float(getattr(snap, name)))
            yield family
        timeouts = CounterMetricFamily(
            "broker_director_slot_timeouts",
            "Admitted Director calls refused (503 compass-unavailable) after waiting twice "
            "BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS for a slot, or sent out of the queue with a "
            "reservation once the estimate showed they would not be served in time: the "
            "schedule's estimate was short.",
        )
        if snap is not None:
            timeouts.add_metric([], float(snap.slot_timeouts))
        yield timeouts
        late = CounterMetricFamily(
            "broker_director_late_calls",
            "Director calls for a waiting caller (the token) held back, answered 503 "
            "capacity-booked with a reservation: by the estimate their answer would reach the "
            "caller after BROKER_REQUEST_DEADLINE_SECONDS from its arrival.",
        )
        if snap is not None:
            late.add_metric([], float(snap.late_calls))
        yield late
