"""The agent's Prometheus metrics, on a registry of its own (several agents can share a process
in tests). Recorded only by the reconcile loop; domain functions return outcomes instead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge

from agent.decide import Reason

# accepted: 202; rate-limited: 429; revoked: 403 runtime-revoked; refused: any other 4xx;
# failed: no answer, 5xx or garbage.
REPORT_OUTCOMES = ("accepted", "rate-limited", "revoked", "refused", "failed")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pull_attempts = Counter(
            "compass_agent_pull_attempts",
            "Requests to the broker for a token, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.last_success = Gauge(
            "compass_agent_last_success_timestamp_seconds",
            "Unix time of the last token written to the secret (0: none since start).",
            registry=self.registry,
        )
        self.state = Enum(
            "compass_agent_state",
            "What the agent decided last, as the reason of its plan.",
            states=[str(r) for r in Reason] + ["starting", "standby"],
            registry=self.registry,
        )
        self.reports = Counter(
            "compass_agent_reports",
            "Connection reports sent to the broker, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.revoked = Gauge(
            "compass_agent_revoked",
            "1 while the control plane has revoked this runtime (the agent only re-checks "
            "slowly), else 0.",
            registry=self.registry,
        )
        self.state.state("starting")
        for outcome in ("issued", "refused", "temporary"):
            self.pull_attempts.labels(outcome=outcome)
        for outcome in REPORT_OUTCOMES:
            self.reports.labels(outcome=outcome)
