"""What each scenario measured, as plain data; the report and the JSON render these and
nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.profiling import ProfileSummary
from bench.prometheus import KcpRequests

MB = 1024 * 1024


@dataclass(frozen=True)
class DirectorCounts:
    """Director calls of one run, by operation (every attempt that reached the simulator)."""

    by_operation: dict[str, int]
    peak_in_flight: int  # Director requests inside the simulator at once (waiting or served)
    peak_active: int  # of those, served at once (the simulator caps this at its capacity)
    # Seconds the simulator spent on these calls, all together (its latency, handler, queue):
    # against capacity x time it shows whether Director or the broker was the limit.
    busy_seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.by_operation.values())

    def get(self, operation: str) -> int:
        return self.by_operation.get(operation, 0)


@dataclass(frozen=True)
class Integrity:
    registrations: int  # runtimes in Director carrying our runtime-ID label
    distinct_runtimes: int
    duplicates: int  # registrations beyond the first per Kyma runtime
    mappings_recorded: int  # CompassManagerMappings with a Compass runtime ID


@dataclass(frozen=True)
class CpuUse:
    """Who used the cores during one run: CPU seconds per process role (broker, fleet,
    compass-sim, kube-apiserver, etcd, bench (harness), ...) and the whole machine."""

    by_role: dict[str, float]
    machine_busy: float  # CPU seconds all cores were busy, whatever ran them
    wall_seconds: float
    cores: int

    @property
    def others(self) -> float:
        """CPU seconds of processes outside this benchmark (other work on the machine)."""
        return max(0.0, self.machine_busy - sum(self.by_role.values()))

    @property
    def capacity(self) -> float:
        return self.wall_seconds * self.cores


@dataclass(frozen=True)
class FleetRunResult:
    """One cold start or outage run of N agents against R broker replicas."""

    scenario: str  # cold | outage
    n: int
    capacity: int
    latency: float
    identity_mode: str  # jwks | tokenreview
    replicas: int
    connected: int
    bound: float  # n * 2 * L / C
    director: DirectorCounts  # cold: the whole run; outage: after Director's return
    integrity: Integrity
    attempts: dict[str, int]  # agent attempts by outcome
    broker_cpu_seconds: float  # all replicas together
    broker_rss_peak_bytes: int  # the largest replica's VmHWM
    kcp: KcpRequests  # requests the control-plane API server served during the run
    cpu: CpuUse
    timed_out: bool
    deadline_seconds: float
    # Seconds since the fleet started asking, one per connection (for the plots).
    connect_times: list[float] = field(default_factory=list)
    seconds: float | None = None  # cold: until the last runtime connected; None if not all did
    profiled: str = ""  # "py-spy" / "cProfile" when this run was profiled
    lost_log_records: int = 0  # simulator records dropped before they were read (0 = all seen)
    # tokenreview: requests the runtime API servers served (TokenReviews), all servers together
    runtime_api: KcpRequests | None = None
    # outage only
    outage_seconds: float = 0.0
    recovery_seconds: float | None = None  # from Director's return until the last connected
    connected_during_outage: int = 0
    first_connect_after_return: float | None = None
    calls_during_outage: int = 0  # to Compass while it was down: Director and OAuth
    oauth_calls_during_outage: int = 0
    breaker_opened_after: float | None = None  # s after Director went down, from the broker
    burst_rule: str = ""  # how the opening burst was told apart from probes
    opening_burst: int = 0  # calls before the breaker opened
    windows_after: list[int] = field(default_factory=list)  # calls per 5 s after it opened
    max_calls_per_window_after: int = 0  # most calls in any sliding 5 s window after it opened
    up_at: float = 0.0  # Director's return, seconds since the fleet started asking
    ended_at: float = 0.0  # when the run ended (all connected or the deadline), same base

    @property
    def time(self) -> float | None:
        """The figure compared with the bound: time to all (cold) or recovery (outage)."""
        return self.recovery_seconds if self.scenario == "outage" else self.seconds

    @property
    def ratio(self) -> float | None:
        t = self.time
        return None if t is None or self.bound <= 0 else t / self.bound

    @property
    def director_busy(self) -> float | None:
        """Share of Director's capacity (C calls at a time, for the measured time) its calls
        used: 1.0 is a Director that never waited for the broker."""
        t = self.time
        return (
            None
            if not t or self.capacity <= 0
            else self.director.busy_seconds / (self.capacity * t)
        )

    @property
    def calls_per_runtime(self) -> float | None:
        newly = self.connected - self.connected_during_outage
        return self.director.total / newly if newly > 0 else None

    @property
    def broker_rss_peak_mb(self) -> float:
        return self.broker_rss_peak_bytes / MB


@dataclass(frozen=True)
class LatencyFigures:
    requests: int
    statuses: dict[str, int]
    p50_ms: float
    p99_ms: float
    max_ms: float
    seconds: float  # wall time of the phase
    broker_cpu_seconds: float
    counted: int  # answers the CPU is divided by (201s or 503s)
    harness_cpu_seconds: float = 0.0  # the benchmark process sending the requests
    # one caller only: latency minus Director's own time for the calls inside each request
    overhead_p50_ms: float | None = None
    overhead_p99_ms: float | None = None
    kcp: KcpRequests | None = None

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def answers_per_second(self) -> float:
        """Answers of the expected kind (tokens, or 503s) per second."""
        return self.counted / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_answer(self) -> float | None:
        return 1000 * self.broker_cpu_seconds / self.counted if self.counted else None

    def unexpected(self, expect: int) -> int:
        return sum(v for k, v in self.statuses.items() if k != str(expect))

    @property
    def kcp_per_answer(self) -> float | None:
        if self.kcp is None or not self.counted:
            return None
        return self.kcp.total / self.counted


@dataclass(frozen=True)
class SteadyResult:
    runtimes: int
    callers: int
    capacity: int
    identity_mode: str
    issued: LatencyFigures  # registered runtimes, `callers` concurrent callers
    single: LatencyFigures  # the same, one caller at a time (no queueing)
    rejected: LatencyFigures  # Director down, breaker open: 503s
    director_p50_ms: float  # time the simulator spent on one requestOneTimeTokenForRuntime
    director_p99_ms: float
    broker_rss_peak_bytes: int = 0


@dataclass(frozen=True)
class ReportsResult:
    """Registered runtimes reporting their connection at the agents' heartbeat (issue 13)."""

    runtimes: int
    heartbeat_seconds: float
    window_seconds: float  # measured
    warmup_writes: int  # KCP writes of the first round (every runtime's state is new)
    statuses: dict[str, int]  # answers in the window
    broker_cpu_seconds: float  # in the window
    kcp: KcpRequests  # the broker's KCP requests in the window

    @property
    def reports(self) -> int:
        return sum(self.statuses.values())

    @property
    def cpu_share(self) -> float:
        """Broker CPU as a share of one core over the window."""
        return self.broker_cpu_seconds / self.window_seconds if self.window_seconds else 0.0

    @property
    def writes(self) -> int:
        return self.kcp.writes

    @property
    def writes_per_second(self) -> float:
        return self.writes / self.window_seconds if self.window_seconds else 0.0


@dataclass(frozen=True)
class FootprintResult:
    idle_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    rss_bytes_end: int
    connect_seconds: float  # from process start until the token secret existed
    pulls: int  # token requests the broker answered for this runtime

    @property
    def cpu_share(self) -> float:
        return self.cpu_seconds / self.idle_seconds if self.idle_seconds > 0 else 0.0


@dataclass(frozen=True)
class Machine:
    cpus: int
    cpu_model: str
    python: str
    platform: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Plan:
    """The configuration measured (the CLI's choices, shown in the report and the JSON)."""

    capacity: int
    broker_concurrency: int  # the brokers' BROKER_DIRECTOR_MAX_CONCURRENCY
    latency: float  # the primary configuration
    outage_seconds: float
    sizes: tuple[int, ...]  # primary cold start and outage
    legacy_latency: float
    legacy_sizes: tuple[int, ...]
    identity_sizes: tuple[int, ...]  # cold start in each identity mode
    tokenreview_clusters: int
    replica_sizes: tuple[int, ...]  # cold start with `replicas` brokers
    replicas: int
    steady_runtimes: int
    steady_callers: int
    report_runtimes: int
    report_heartbeat: float
    report_window: float
    fleet_processes: int
    max_run_seconds: float
    scenarios: tuple[str, ...] = ()


@dataclass
class BenchReport:
    command: str
    machine: Machine
    plan: Plan
    notes: list[str] = field(default_factory=list)
    runs: list[FleetRunResult] = field(default_factory=list)
    steady: SteadyResult | None = None
    reports: ReportsResult | None = None
    footprint: FootprintResult | None = None
    profile: ProfileSummary | None = None
    plots: dict[str, str] = field(default_factory=dict)  # scenario -> file name
    started: str = ""
    duration_seconds: float = 0.0
    commit: str = ""  # short hash of the code measured
    uncommitted: list[str] = field(default_factory=list)  # measured parts with local changes

    @property
    def revision(self) -> str:
        if not self.commit:
            return ""
        changed = ", ".join(self.uncommitted)
        return f"commit {self.commit}" + (
            f" with uncommitted changes in {changed}" if changed else ""
        )

    def runs_of(self, scenario: str) -> list[FleetRunResult]:
        return [r for r in self.runs if r.scenario == scenario]
