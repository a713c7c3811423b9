"""Results of a small, made-up benchmark run for the report and JSON tests: every scenario
once, with the figures that decide each target passed in."""

from __future__ import annotations

from bench.plan import ALL_SCENARIOS
from bench.profiling import FrameShare, ProfileSummary
from bench.prometheus import KcpRequests
from bench.results import (
    BenchReport,
    CpuUse,
    DirectorCounts,
    FleetRunResult,
    FootprintResult,
    Integrity,
    LatencyFigures,
    Machine,
    Plan,
    ReportsResult,
    SteadyResult,
)

PLAN = Plan(
    capacity=8,
    broker_concurrency=10,
    latency=0.1,
    outage_seconds=60.0,
    sizes=(100, 1000),
    legacy_latency=0.05,
    legacy_sizes=(100,),
    identity_sizes=(1000,),
    tokenreview_clusters=3,
    replica_sizes=(1000,),
    replicas=2,
    steady_runtimes=400,
    steady_callers=200,
    report_runtimes=5000,
    report_heartbeat=300.0,
    report_window=60.0,
    fleet_processes=1,
    max_run_seconds=1800.0,
    scenarios=ALL_SCENARIOS,
)


def a_run(
    *,
    scenario: str,
    n: int,
    ratio: float,
    calls: float = 2.0,
    window: int = 1,
    connected: int | None = None,
    duplicates: int = 0,
    identity_mode: str = "jwks",
    replicas: int = 1,
    fleet_cpu: float = 5.0,
) -> FleetRunResult:
    """A run whose time is `ratio` x the bound at C = 8, L = 100 ms, with `calls` Director
    calls per runtime (lookups beyond 2) and `window` calls in its worst 5 s while down."""
    bound = 2 * n * 0.1 / 8
    connected = n if connected is None else connected
    time = ratio * bound if connected == n else None
    director = DirectorCounts(
        by_operation={
            "runtimes": round((calls - 2) * connected),
            "registerRuntime": connected,
            "requestOneTimeTokenForRuntime": connected,
        },
        peak_in_flight=8,
        peak_active=8,
        busy_seconds=0.1 * calls * connected,  # each call took L
    )
    outage = scenario == "outage"
    return FleetRunResult(
        scenario=scenario,
        n=n,
        capacity=8,
        latency=0.1,
        identity_mode=identity_mode,
        replicas=replicas,
        connected=connected,
        bound=bound,
        director=director,
        integrity=Integrity(
            registrations=connected + duplicates,
            distinct_runtimes=connected,
            duplicates=duplicates,
            mappings_recorded=connected,
        ),
        attempts={"201": connected, "503 compass-unavailable": 7},
        broker_cpu_seconds=12.0,
        broker_rss_peak_bytes=120 * 1024 * 1024,
        kcp=KcpRequests({"GET compassmanagermappings": n, "PATCH compassmanagermappings": n}),
        cpu=CpuUse(
            by_role={"broker": 12.0, "fleet": fleet_cpu, "compass-sim": 3.0, "etcd": 1.0},
            machine_busy=30.0,
            wall_seconds=32.0,
            cores=2,
        ),
        timed_out=connected < n,
        deadline_seconds=300.0,
        connect_times=[1.0, 2.0, 3.0],
        seconds=None if outage else time,
        outage_seconds=60.0 if outage else 0.0,
        recovery_seconds=time if outage else None,
        calls_during_outage=12 if outage else 0,
        oauth_calls_during_outage=5 if outage else 0,
        breaker_opened_after=1.5 if outage else None,
        burst_rule="calls before the broker's breaker gauge first read open" if outage else "",
        opening_burst=9 if outage else 0,
        windows_after=[window, 0, 1] if outage else [],
        max_calls_per_window_after=window if outage else 0,
        up_at=60.0 if outage else 0.0,
        ended_at=95.0 if outage else (time or 300.0),
    )


def _figures(
    *, status: str, count: int, seconds: float, cpu: float, overhead_p99: float | None = None
) -> LatencyFigures:
    return LatencyFigures(
        requests=count,
        statuses={status: count},
        p50_ms=4.0,
        p99_ms=20.0,
        max_ms=30.0,
        seconds=seconds,
        broker_cpu_seconds=cpu,
        counted=count,
        harness_cpu_seconds=0.5,
        overhead_p50_ms=None if overhead_p99 is None else overhead_p99 / 2,
        overhead_p99_ms=overhead_p99,
        kcp=KcpRequests({"PATCH events": count}) if status == "201" else None,
    )


def a_report(
    *,
    ratio: float = 1.2,
    calls: float = 2.0,
    overhead_p99: float = 8.0,
    rss_mb: float = 50.0,
    window: int = 1,
    report_cpu: float = 1.2,
    report_writes: int = 84,
) -> BenchReport:
    r = BenchReport(
        command="python -m bench",
        machine=Machine(
            cpus=2, cpu_model="cpu", python="3.11.7", platform="Linux", load_before=(1, 1, 1)
        ),
        plan=PLAN,
        commit="abc1234",
    )
    r.runs = [
        a_run(scenario="cold", n=1000, ratio=ratio, calls=calls),
        a_run(scenario="outage", n=1000, ratio=ratio, calls=calls, window=window),
        a_run(scenario="cold", n=1000, ratio=ratio, identity_mode="tokenreview"),
        a_run(scenario="cold", n=1000, ratio=ratio, replicas=2),
    ]
    r.steady = SteadyResult(
        runtimes=400,
        callers=200,
        capacity=8,
        identity_mode="jwks",
        single=_figures(status="201", count=50, seconds=1.0, cpu=0.1, overhead_p99=overhead_p99),
        issued=_figures(status="201", count=300, seconds=0.5, cpu=0.9),
        rejected=_figures(status="503", count=300, seconds=0.5, cpu=0.15),
        director_p50_ms=0.5,
        director_p99_ms=1.0,
        broker_rss_peak_bytes=90 * 1024 * 1024,
    )
    r.reports = ReportsResult(
        runtimes=5000,
        heartbeat_seconds=300.0,
        window_seconds=60.0,
        warmup_writes=5000,
        statuses={"202": 1000},
        broker_cpu_seconds=report_cpu,
        kcp=KcpRequests({"PATCH compassmanagermappings": report_writes, "GET leases": 12}),
    )
    r.footprint = FootprintResult(
        idle_seconds=60,
        cpu_seconds=0.3,
        peak_rss_bytes=int(rss_mb * 1024 * 1024),
        rss_bytes_end=int(rss_mb * 1024 * 1024),
        connect_seconds=2.0,
        pulls=1,
    )
    r.profile = ProfileSummary(
        tool="py-spy",
        run="cold N=1,000 L=100ms",
        samples=100,
        top_own=[FrameShare(frame="f (a/b.py)", share=0.5)],
    )
    return r
