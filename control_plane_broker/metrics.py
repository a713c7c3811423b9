"""Prometheus metrics on the broker's own registry (no global default registry, so tests and
several apps in one process stay apart). Labels are fixed, low-cardinality words: never IDs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.token_requests = Counter(
            "broker_token_requests_total", "Token requests by outcome.", ["outcome"], registry=r
        )
        self.identity_failures = Counter(
            "broker_identity_failures_total",
            "Identity checks that failed, by mode and reason.",
            ["mode", "reason"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "broker_circuit_breaker_open",
            "1 while the Director breaker is open or half-open.",
            registry=r,
        )
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
        self.labels_synced = Counter(
            "broker_director_labels_synced_total", "Director labels written.", registry=r
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
        self.request_seconds = Histogram(
            "broker_token_request_seconds", "Duration of token requests.", registry=r
        )

    def on_kube_request(self, verb: str, _status: int | None) -> None:
        self.kube_requests.labels(verb).inc()

    def on_breaker_state(self, state: str) -> None:
        self.breaker_state.set(0 if state == "closed" else 1)
