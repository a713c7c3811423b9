"""Which fleet runs a benchmark makes, in which order, and how long each may take: pure.

Holds: the primary configuration (C, L, every size, cold start and outage) comes first, small
sizes before large ones, so an interrupted run still has the smaller rows; then the second
latency, the identity modes and the replicas. A run that another table needs (the `jwks`
row beside `tokenreview`, the one-replica row beside two) is made once and shared. The profile
is a run of its own at the end, a repeat of the largest primary cold start: the profiler takes
CPU from the 2 cores the measured runs share, so no figure in the tables comes from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import stats
from bench.results import Plan

FLEET_SCENARIOS = ("cold", "outage", "legacy", "identity", "replicas")
OTHER_SCENARIOS = ("steady", "reports", "footprint", "slow")
ALL_SCENARIOS = (*FLEET_SCENARIOS, *OTHER_SCENARIOS)
SETUP_SECONDS_PER_RUN = 15.0  # simulator, broker start, namespace (measured: 8 to 15 s)
SEED_SECONDS_PER_RUNTIME = 0.006  # Kyma CRs (and Secrets) created at 24 at a time


@dataclass(frozen=True)
class RunSpec:
    scenario: str  # cold | outage
    n: int
    latency: float
    identity_mode: str = "jwks"
    replicas: int = 1
    profile: bool = False

    @property
    def label(self) -> str:
        extra = "" if self.identity_mode == "jwks" else f", {self.identity_mode}"
        extra += "" if self.replicas == 1 else f", {self.replicas} replicas"
        extra += ", profiled" if self.profile else ""
        return f"{self.scenario} N={self.n:,} L={self.latency * 1000:.0f}ms{extra}"

    def key(self) -> tuple[str, int, float, str, int, bool]:
        return (
            self.scenario,
            self.n,
            self.latency,
            self.identity_mode,
            self.replicas,
            self.profile,
        )


def fleet_runs(plan: Plan, scenarios: tuple[str, ...], *, profile: bool = False) -> list[RunSpec]:
    runs: list[RunSpec] = []

    def add(spec: RunSpec) -> None:
        if all(spec.key() != r.key() for r in runs):
            runs.append(spec)

    for n in sorted(plan.sizes):
        if "cold" in scenarios:
            add(RunSpec("cold", n, plan.latency))
        if "outage" in scenarios:
            add(RunSpec("outage", n, plan.latency))
    if "legacy" in scenarios:
        for n in sorted(plan.legacy_sizes):
            add(RunSpec("cold", n, plan.legacy_latency))
            add(RunSpec("outage", n, plan.legacy_latency))
    if "identity" in scenarios:
        for n in sorted(plan.identity_sizes):
            add(RunSpec("cold", n, plan.latency))
            add(RunSpec("cold", n, plan.latency, identity_mode="tokenreview"))
    if "replicas" in scenarios and plan.replicas > 1:
        for n in sorted(plan.replica_sizes):
            add(RunSpec("cold", n, plan.latency))
            add(RunSpec("cold", n, plan.latency, replicas=plan.replicas))
    if profile:
        primary = [
            r
            for r in runs
            if r.scenario == "cold"
            and r.latency == plan.latency
            and r.identity_mode == "jwks"
            and r.replicas == 1
        ]
        if primary:
            target = max(primary, key=lambda r: r.n)
            runs.append(RunSpec(**{**target.__dict__, "profile": True}))
    return runs


def deadline(plan: Plan, spec: RunSpec) -> float:
    """The run's limit: max(10x bound, 300 s), capped by --max-run-seconds; an outage adds T."""
    bound = stats.capacity_bound(spec.n, latency=spec.latency, capacity=plan.capacity)
    extra = plan.outage_seconds if spec.scenario == "outage" else 0.0
    return stats.run_deadline(bound, cap=plan.max_run_seconds) + extra


def expected_seconds(plan: Plan, spec: RunSpec) -> tuple[float, float]:
    """(at the targets, at every deadline): wall time of one run including its set-up."""
    bound = stats.capacity_bound(spec.n, latency=spec.latency, capacity=plan.capacity)
    setup = SETUP_SECONDS_PER_RUN * spec.replicas + SEED_SECONDS_PER_RUNTIME * spec.n * (
        2 if spec.identity_mode == "tokenreview" else 1
    )
    outage = plan.outage_seconds if spec.scenario == "outage" else 0.0
    return setup + outage + 1.25 * bound, setup + deadline(plan, spec)


def describe(plan: Plan, runs: list[RunSpec], *, other: tuple[str, ...]) -> list[str]:
    """Lines for `--plan`: each run with bound and deadline, and the total either way."""
    lines = []
    best = worst = 0.0
    for spec in runs:
        bound = stats.capacity_bound(spec.n, latency=spec.latency, capacity=plan.capacity)
        fast, slow = expected_seconds(plan, spec)
        best += fast
        worst += slow
        lines.append(
            f"{spec.label:<45} bound {bound:7.1f} s, deadline {deadline(plan, spec):6.0f} s"
            + (" (profiled)" if spec.profile else "")
        )
    fixed = 0.0
    if "steady" in other:
        fixed += 120.0 + plan.steady_runtimes * 0.1
        lines.append(
            f"steady state ({plan.steady_runtimes} runtimes, {plan.steady_callers} callers)"
        )
    if "reports" in other:
        fixed += 60.0 + plan.report_runtimes * 0.02 + plan.report_window
        lines.append(
            f"connection reports ({plan.report_runtimes} registered runtimes, "
            f"{plan.report_heartbeat:.0f} s heartbeat, {plan.report_window:.0f} s measured)"
        )
    if "footprint" in other:
        fixed += 90.0
        lines.append("agent footprint (one real agent, idle)")
    if "slow" in other:
        fixed += 240.0
        lines.append("slow Director (bench.slow: --slow-n runtimes, --slow-latency per call)")
    lines.append(
        f"expected: about {(best + fixed) / 60:.0f} min if every run meets its target, "
        f"at most about {(worst + fixed) / 60:.0f} min if every run reaches its deadline"
    )
    return lines
