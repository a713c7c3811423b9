"""What each scenario measured, as plain data; the report renders these and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DirectorCounts:
    """Director calls of one run, by operation (every attempt that reached the simulator)."""

    by_operation: dict[str, int]
    peak_in_flight: int  # Director requests inside the simulator at once (waiting or served)
    peak_active: int  # of those, served at once (the simulator caps this at its capacity)

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
class ColdStartResult:
    n: int
    capacity: int
    latency: float
    connected: int
    seconds: float | None  # until the last runtime connected; None if not all did
    bound: float  # n * 2 * L / C
    director: DirectorCounts
    integrity: Integrity
    attempts: dict[str, int]  # agent attempts by outcome
    broker_cpu_seconds: float
    timed_out: bool


@dataclass(frozen=True)
class OutageResult:
    n: int
    capacity: int
    latency: float
    outage_seconds: float
    connected: int
    connected_during_outage: int
    recovery_seconds: float | None  # from Director's return until the last runtime connected
    first_connect_after_return: float | None
    bound: float
    calls_during_outage: int  # to Compass while it was down: Director and OAuth token endpoint
    calls_first_window: int  # the opening burst: calls before the first 5 s without any
    max_calls_per_window_after: int  # most calls in any 5 s window after that burst (probes)
    director_after_return: DirectorCounts
    integrity: Integrity
    attempts: dict[str, int]
    broker_cpu_seconds: float
    timed_out: bool
    # For the plot: seconds since the fleet started asking, one per connection, and when
    # Director went down and came back (same time base).
    oauth_calls_during_outage: int = 0  # of those, to the OAuth token endpoint
    connect_times: list[float] = field(default_factory=list)
    down_at: float = 0.0
    up_at: float = 0.0
    ended_at: float = 0.0  # when the fleet run ended (all connected or the deadline)


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

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_answer(self) -> float | None:
        return 1000 * self.broker_cpu_seconds / self.counted if self.counted else None


@dataclass(frozen=True)
class SteadyResult:
    runtimes: int
    callers: int
    issued: LatencyFigures  # registered runtimes, 200 concurrent callers
    single: LatencyFigures  # the same, one caller at a time (no queueing)
    rejected: LatencyFigures  # Director down, breaker open: 503s
    director_p50_ms: float  # time the simulator spent on one requestOneTimeTokenForRuntime
    director_p99_ms: float


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


@dataclass
class BenchReport:
    command: str
    machine: Machine
    capacity: int
    latency: float
    outage_seconds: float
    sizes: list[int]
    notes: list[str] = field(default_factory=list)
    cold: list[ColdStartResult] = field(default_factory=list)
    outage: list[OutageResult] = field(default_factory=list)
    steady: SteadyResult | None = None
    footprint: FootprintResult | None = None
    plot_file: str | None = None
    started: str = ""
    duration_seconds: float = 0.0
    revision: str = ""  # commit of the code measured, and which parts had uncommitted changes
