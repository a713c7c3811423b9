"""The slow-Director scenario (issue 35, item 5): does the broker keep Director busy while work
waits, when every call takes seconds?

N runtimes start cold at once against a Director whose every call takes a uniform random time
in [`min`, `max`] seconds (the simulator's `latency` fault on the Director endpoint, or the real
Director's gateway, `bench.real`), with no limit on Director's own concurrency: the broker's
`BROKER_DIRECTOR_MAX_CONCURRENCY` slots are the limit. Measured from Director's own request log
(each call's start = its answer's time less its duration):

- **in flight**: Director's calls in flight, averaged over each second from the start of the
  first call while at least S runtimes still wait for their registration (to the start of the
  (N - S + 1)-th `registerRuntime`: until then there is a first call for every slot that
  frees, so a free slot means Director idles while work waits), against the broker's slots
  S; the worst second and the share of seconds at or above 80 %;
- **time to all connected** against the bound the latency allows:
  `bound = N * 2 * L / S + L`, with S the broker's slots, L the mean duration of the run's
  Director calls as Director's log has them, 2 calls per new runtime (`registerRuntime`,
  `requestOneTimeTokenForRuntime`); the last runtime's token can only start after its
  registration ended, hence the one call added.

Against the real Director (`python -m bench.real --scenarios slow`) its gateway keeps no log of
each call, so Director's side is read from the broker: in flight is the broker's
`broker_director_calls_in_flight`, sampled once a second (a call holding a slot: Director's
latency and the broker's turn around it), and L its own estimate of a call
(`broker_director_call_seconds_estimate`, slot seconds per reserved call), its median over the
samples with calls in flight; the window ends 2 L before the (N - S + 1)-th runtime got its
token (about when its registration started).

Holds: pure apart from `merge_docs` (reads and writes the two report files); the section and the
JSON key are this module's alone, everything else in the files is left as it was.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.report import FINDINGS_RECORD, merge_marked_section

SECTION_BEGIN = "<!-- bench.slow: begin (python -m bench --scenarios slow rewrites its row) -->"
SECTION_END = "<!-- bench.slow: end -->"
JSON_KEY = "slow_director"
IN_FLIGHT_TARGET = 0.8  # share of the broker's slots Director keeps busy while work waits
RATIO_TARGET = 1.15
DEFAULT_N = 200
DEFAULT_LATENCY = (3.0, 5.0)
CALLS_PER_RUNTIME = 2
REGISTER = "registerRuntime"


@dataclass(frozen=True)
class Interval:
    """One Director call as Director's log has it."""

    start: float
    end: float
    operation: str


@dataclass
class SlowRun:
    """One cold start against a slow Director."""

    target: str  # simulator | real Director
    commit: str
    started: str  # UTC
    n: int
    slots: int  # the broker's BROKER_DIRECTOR_MAX_CONCURRENCY
    latency_min: float
    latency_max: float
    connected: int
    seconds: float | None  # fleet start to the last runtime connected
    mean_latency: float  # measured: mean duration of the run's Director calls
    bound: float
    window_from: float  # seconds after the fleet's start: the first call's start
    window_to: float  # while S runtimes still waited for their registration: until then
    worst_second: float  # lowest share of the slots in flight over one second of the window
    worst_second_at: float  # its start, seconds after the fleet's start
    seconds_at_target: float  # share of the window's seconds at or above the target
    mean_in_flight: float  # share of the slots, over the window
    calls: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # agent attempts by answer
    slot_timeouts: int = 0  # broker_director_slot_timeouts_total at the end
    late_calls: int = 0
    duplicates: int = 0
    # Calls in flight (share of S) in each second of the window, for the JSON: where it dipped.
    series: list[float] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-min load average before, after
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.seconds is None or self.bound <= 0 else self.seconds / self.bound

    @property
    def met(self) -> bool:
        ratio = self.ratio
        return (
            self.connected == self.n
            and ratio is not None
            and ratio <= RATIO_TARGET
            and self.worst_second >= IN_FLIGHT_TARGET
        )


def latency_bound(n: int, *, latency: float, slots: int, calls: int = CALLS_PER_RUNTIME) -> float:
    """N * calls * L / S + L: the slots serve S calls every L seconds, and the last runtime's
    last call starts only when its previous one ended."""
    if n < 0 or latency < 0 or slots < 1:
        raise ValueError("n and latency must not be negative, slots at least 1")
    return n * calls * latency / slots + latency


def in_flight_by_second(
    calls: Sequence[Interval], *, start: float, end: float
) -> list[tuple[float, float]]:
    """(second's start, calls in flight averaged over that second) for each whole second in
    [start, end); an interval is counted for the part of the second it covers."""
    out: list[tuple[float, float]] = []
    for i in range(max(0, math.floor(end - start))):
        lo = start + i
        hi = lo + 1.0
        busy = sum(max(0.0, min(c.end, hi) - max(c.start, lo)) for c in calls)
        out.append((lo, busy))
    return out


@dataclass(frozen=True)
class InFlight:
    window_from: float
    window_to: float
    worst: float  # share of the slots
    worst_at: float
    at_target: float  # share of the seconds
    mean: float
    series: tuple[float, ...] = ()  # share of the slots in each second


def in_flight(
    calls: Sequence[Interval],
    *,
    slots: int,
    target: float = IN_FLIGHT_TARGET,
    not_before: float | None = None,
) -> InFlight:
    """Director's calls in flight while work waits for every slot: from the first call's start
    (or `not_before`, if later) while at least `slots` runtimes still wait for their
    registration (see the module docstring)."""
    if not calls:
        return InFlight(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    first = max(min(c.start for c in calls), not_before if not_before is not None else -math.inf)
    registrations = sorted(c.start for c in calls if c.operation == REGISTER)
    last = registrations[max(0, len(registrations) - slots)] if registrations else first
    seconds = in_flight_by_second(calls, start=first, end=last)
    if not seconds:
        return InFlight(first, last, 1.0, first, 1.0, 1.0)
    shares = [(busy / slots, at) for at, busy in seconds]
    worst, worst_at = min(shares)
    return InFlight(
        window_from=first,
        window_to=last,
        worst=worst,
        worst_at=worst_at,
        at_target=sum(1 for share, _ in shares if share >= target - 1e-9) / len(shares),
        mean=sum(share for share, _ in shares) / len(shares),
        series=tuple(round(share, 2) for share, _ in shares),
    )


def intervals(records: Iterable[tuple[float, float, str]]) -> list[Interval]:
    """(answered at, duration, operation) records of Director calls as intervals."""
    return [Interval(start=at - duration, end=at, operation=op) for at, duration, op in records]


def result(
    *,
    target: str,
    commit: str,
    started: str,
    n: int,
    slots: int,
    latency: tuple[float, float],
    connected: int,
    seconds: float | None,
    calls: Sequence[Interval],
    since: float,
    attempts: dict[str, int],
    gauges: Sequence[dict[str, float]],
    duplicates: int,
    load: tuple[float, float],
    note: str = "",
) -> SlowRun:
    """A run's figures from Director's calls (`calls`, on the clock of `since`, the fleet's
    start) and the brokers' gauges at the end."""
    mean = sum(c.end - c.start for c in calls) / len(calls) if calls else (sum(latency) / 2)
    flight = in_flight(calls, slots=slots)
    return SlowRun(
        target=target,
        commit=commit,
        started=started,
        n=n,
        slots=slots,
        latency_min=latency[0],
        latency_max=latency[1],
        connected=connected,
        seconds=seconds,
        mean_latency=mean,
        bound=latency_bound(n, latency=mean, slots=slots),
        window_from=flight.window_from - since,
        window_to=flight.window_to - since,
        worst_second=flight.worst,
        worst_second_at=flight.worst_at - since,
        seconds_at_target=flight.at_target,
        mean_in_flight=flight.mean,
        calls=dict(sorted(Counter(c.operation for c in calls).items())),
        attempts=dict(sorted(attempts.items())),
        slot_timeouts=int(sum(g.get("broker_director_slot_timeouts_total", 0.0) for g in gauges)),
        late_calls=int(sum(g.get("broker_director_late_calls_total", 0.0) for g in gauges)),
        duplicates=duplicates,
        load=load,
        note=note,
        series=list(flight.series),
    )


def result_from_gauges(
    *,
    target: str,
    commit: str,
    started: str,
    n: int,
    slots: int,
    latency: tuple[float, float],
    connected: int,
    seconds: float | None,
    connect_times: Sequence[float],
    samples: Sequence[dict[str, float]],
    since: float,
    calls: dict[str, int],
    attempts: dict[str, int],
    duplicates: int,
    load: tuple[float, float],
    note: str = "",
) -> SlowRun:
    """A run's figures from the broker's gauges, sampled once a second (`samples`, each with
    `unix_seconds`; `connect_times` and the result on the clock of `since`): for a Director
    that logs no call (see the module docstring)."""
    busy = [s for s in samples if s.get("broker_director_calls_in_flight", 0.0) > 0]
    # The median while calls were in flight: the estimate starts at its first guess (0.1 s)
    # and takes a few calls to get there.
    estimates = sorted(s.get("broker_director_call_seconds_estimate", 0.0) for s in busy)
    mean = estimates[len(estimates) // 2] if estimates else sum(latency) / 2
    ordered = sorted(connect_times)
    first = min((s["unix_seconds"] for s in busy), default=since) - since
    last = ordered[max(0, len(ordered) - slots)] - 2 * mean if ordered else first
    window = [
        (s["unix_seconds"] - since, s["broker_director_calls_in_flight"] / slots)
        for s in samples
        if first <= s["unix_seconds"] - since <= last
    ]
    worst, worst_at = min(((share, at) for at, share in window), default=(0.0, 0.0))
    return SlowRun(
        target=target,
        commit=commit,
        started=started,
        n=n,
        slots=slots,
        latency_min=latency[0],
        latency_max=latency[1],
        connected=connected,
        seconds=seconds,
        mean_latency=mean,
        bound=latency_bound(n, latency=mean, slots=slots),
        window_from=first,
        window_to=last,
        worst_second=worst,
        worst_second_at=worst_at,
        seconds_at_target=(
            sum(1 for _, share in window if share >= IN_FLIGHT_TARGET - 1e-9) / len(window)
            if window
            else 0.0
        ),
        mean_in_flight=sum(share for _, share in window) / len(window) if window else 0.0,
        calls=dict(sorted(calls.items())),
        attempts=dict(sorted(attempts.items())),
        slot_timeouts=int(
            max((s.get("broker_director_slot_timeouts_total", 0.0) for s in samples), default=0)
        ),
        late_calls=int(
            max((s.get("broker_director_late_calls_total", 0.0) for s in samples), default=0)
        ),
        duplicates=duplicates,
        load=load,
        note=note,
        series=[round(share, 2) for _, share in window],
    )


# --- the report section ------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _attempts(attempts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(attempts.items(), key=lambda kv: -kv[1]))


def render(runs: Sequence[SlowRun]) -> str:
    """The section's Markdown (without its markers)."""
    lines = [
        "## 12. A slow Director: every call takes seconds (issue 35)",
        "",
        "N runtimes start cold; each Director call takes a random time in the range shown, "
        "any number at once, so the broker's S slots are the limit. Targets: calls in flight "
        f"≥ {IN_FLIGHT_TARGET:.0%} of S every second while S runtimes wait to register; all "
        f"connected within {RATIO_TARGET}x N x 2 x L / S + L (L: the mean call). Method: "
        f"[0016](design/{FINDINGS_RECORD}).",
        "",
    ]
    if not runs:
        return "\n".join([*lines, "Not measured yet."])
    header = [
        "Director",
        "commit",
        "N",
        "latency",
        "S",
        "connected",
        "time to all",
        "bound",
        "ratio",
        "worst second in flight",
        f"seconds ≥ {IN_FLIGHT_TARGET:.0%}",
        "mean in flight",
        "Director calls",
        "slot timeouts",
        "duplicates",
        "met",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in runs:
        ratio = r.ratio
        cells = [
            r.target,
            f"`{r.commit}`" if r.commit else "-",
            f"{r.n:,}",
            f"{r.latency_min:g}-{r.latency_max:g} s (mean {r.mean_latency:.2f} s)",
            str(r.slots),
            f"{r.connected:,}",
            _s(r.seconds),
            f"{r.bound:.1f} s",
            "-" if ratio is None else f"{ratio:.2f}x",
            f"{r.worst_second:.0%} (at {r.worst_second_at:.0f} s)",
            f"{r.seconds_at_target:.0%}",
            f"{r.mean_in_flight:.0%}",
            ", ".join(f"{k} {v:,}" for k, v in sorted(r.calls.items())),
            str(r.slot_timeouts),
            str(r.duplicates),
            "yes" if r.met else "**no**",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in runs:
        lines.append(
            f"- {r.target}, {r.started}: window {r.window_from:.1f}-{r.window_to:.1f} s; attempts "
            f"{_attempts(r.attempts)}; held back for their deadline {r.late_calls}; load "
            f"{r.load[0]:.2f} → {r.load[1]:.2f}" + (f"; {r.note}" if r.note else "") + "."
        )
    lines += [
        "",
        "Reproduce: `python -m bench --scenarios slow` (simulator) or `python -m bench.real "
        "--scenarios slow --docs` (real Director); each rewrites its own row.",
    ]
    return "\n".join(lines)


def merge_section(text: str, section: str) -> str:
    """`text` with this section replaced (`bench.report.merge_marked_section`)."""
    return merge_marked_section(text, section, begin=SECTION_BEGIN, end=SECTION_END)


def from_json(data: Any) -> list[SlowRun]:
    """The runs a report's JSON kept under `JSON_KEY` (unreadable entries skipped)."""
    runs: list[SlowRun] = []
    for item in (data or {}).get("runs", []) if isinstance(data, dict) else []:
        try:
            runs.append(SlowRun(**{**item, "load": tuple(item.get("load", (0.0, 0.0)))}))
        except TypeError:
            continue
    return runs


def to_json(runs: Sequence[SlowRun]) -> dict[str, Any]:
    return {"runs": [asdict(r) for r in runs]}


def merged_runs(old: Sequence[SlowRun], new: Sequence[SlowRun]) -> list[SlowRun]:
    """One row per target: the new ones replace the old ones of the same target."""
    targets = {r.target for r in new}
    return [*(r for r in old if r.target not in targets), *new]


def merge_docs(out_dir: Path, new: Sequence[SlowRun], *, report: str, data_file: str) -> None:
    """Writes `new` into the section and the JSON key of the report files in `out_dir`,
    keeping the other target's row and everything else in both files."""
    md_path, json_path = out_dir / report, out_dir / data_file
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    try:
        data = json.loads(json_path.read_text()) if json_path.exists() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    runs = merged_runs(from_json(data.get(JSON_KEY)), new)
    data[JSON_KEY] = to_json(runs)
    md_path.write_text(merge_section(text, render(runs)))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
