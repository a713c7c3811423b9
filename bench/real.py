"""`python -m bench.real`: the fleet benchmarks of issue 26 against the real Compass Director.

Two scenarios, chosen with `--scenarios` (default both):

- `lost`: N runtimes (default 200) start cold while 30 % of `registerRuntime` answers are
  lost after Director acted, once against the Compass simulator (its counted lost responses,
  one in every 1/0.3 registrations, armed one at a time) and once against the real Director
  (the gateway loses each answer with probability 0.3). After everyone connected the bench
  waits a few reconciler sweeps (their period shortened to 5 s) so label write-backs are
  counted, then counts every Director call (all operations) per runtime and the duplicates in
  Director's own store: the simulator's, or Director's PostgreSQL grouped by
  `kyma_runtime_id`.
- `slow`: every call of Director's takes 3-5 s (the gateway's `set_latency`), N (default 200)
  runtimes start cold through one broker: Director's calls in flight while work waits, and the
  time to all connected against the bound the latency allows (`bench.slow`, its own section of
  docs/benchmarks.md, the `real Director` row).
- `cut`: N (default 200) runtimes start cold through one broker; once a quarter is registered
  every database session Director holds is ended every 0.5 s for 20 s: Director calls per new
  runtime, tokens per runtime, duplicates in Director's database (`bench.sessions_cut`, its own
  section of docs/benchmarks.md).
- `real`: Director's own capacity here first (register + token pairs per second sent straight
  to the gateway, at the brokers' concurrency and at C), then a cold start of N (default
  1,000) through one broker against the real Director: time to all connected against the
  time that capacity allows, agent timeouts, one-time tokens issued, duplicates.

Each scenario gets a fresh real Director stack (its PostgreSQL, its gateway) on the bench's
KCP API server. With `--cpus auto` (the default, on a machine with two CPUs or more) Director,
PostgreSQL and the gateway's thread run on the first CPU and everything else (the bench, the
KCP API server, brokers, fleet) on the others, in the capacity measurement and in the cold
start alike: the bound is measured with the CPU Director has during the run. Figures go to
`<out-dir>/benchmarks-real.json` and `.md`; `--docs` also puts them into docs/benchmarks.md (a
section of its own) and docs/benchmarks.json (key `real_director`), leaving everything else
there as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx

from bench import plan as planning
from bench import sessions_cut, slow, stats
from bench.keys import new_runtime_keys
from bench.plan import RunSpec
from bench.procs import CLOCK_TICKS, Child, CpuSnapshot, cpu_by_role, run_until_stopped
from bench.progress import Progress
from bench.report import merge_marked_section, recorded_command
from bench.results import Plan
from bench.scenarios import ADMISSION_GAUGES, RUNTIME_ID_LABEL, Bench, BenchConfig, label_value
from bench.stack import ApiServer, Simulator, global_account

REPO_ROOT = Path(__file__).resolve().parent.parent
LOST_RATIO = 0.3
LOST_N = 200
REAL_N = 1000
CAPACITY_PAIRS = 400
SWEEP_SECONDS = 5.0
SWEEPS_WAITED = 3
CALLS_TARGET = 3.0
RATIO_TARGET = 1.25
SECTION_BEGIN = "<!-- bench.real: begin (python -m bench.real --docs rewrites this section) -->"
SECTION_END = "<!-- bench.real: end -->"
JSON_KEY = "real_director"
PROVIDER = "kyma-compass-pull bench"
REGISTER = """mutation RegisterRuntime($in: RuntimeRegisterInput!) {
  registerRuntime(in: $in) { id name labels } }"""
TOKEN = """mutation RequestOneTimeTokenForRuntime($id: ID!) {
  requestOneTimeTokenForRuntime(id: $id) { token connectorURL used expiresAt } }"""
# The broker's look-ups before a registration it cannot prove new: by its label, then by
# compass-manager's (control_plane_broker/registration/service.py, `find`).
LOOKUP_LABELS = (RUNTIME_ID_LABEL, "gardenerClusterName")


# --- pure pieces ---------------------------------------------------------------------------------


def duplicates_by_label(runtimes: Iterable[Mapping[str, Any]], key: str = RUNTIME_ID_LABEL) -> int:
    """Registrations beyond the first per value of label `key` (runtimes without it ignored)."""
    values = [label_value(dict(r.get("labels") or {}), key) for r in runtimes]
    return stats.duplicate_registrations(v for v in values if v)


def registrations_of(
    runtimes: Iterable[Mapping[str, Any]], ids: Iterable[str], key: str = RUNTIME_ID_LABEL
) -> list[Mapping[str, Any]]:
    """The registrations whose label `key` is one of `ids` (the run's own runtimes)."""
    wanted = set(ids)
    return [r for r in runtimes if label_value(dict(r.get("labels") or {}), key) in wanted]


def call_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Calls per operation made between two readings of cumulative counters."""
    out = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return {k: v for k, v in sorted(out.items()) if v}


def calls_per_runtime(calls: Mapping[str, int], runtimes: int) -> float | None:
    """Every Director call (all operations) divided by the runtimes served."""
    return sum(calls.values()) / runtimes if runtimes else None


def agent_timeouts(attempts: Mapping[str, int]) -> int:
    """Agent attempts that ended in the agent's own timeout (`transport error ...Timeout`)."""
    return sum(v for k, v in attempts.items() if "timeout" in k.lower())


def quartiles(connect_times: Sequence[float], n: int) -> list[float | None]:
    """Seconds (from the start) until 25, 50, 75 and 100 % of `n` were connected."""
    ordered = sorted(connect_times)
    out: list[float | None] = []
    for share in (0.25, 0.5, 0.75, 1.0):
        k = max(1, round(n * share))
        out.append(round(ordered[k - 1], 2) if len(ordered) >= k else None)
    return out


def cpu_by_program(by_role: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per program: PostgreSQL's backends (one role per connection) as one."""
    out: Counter[str] = Counter()
    for role, seconds in by_role.items():
        out["postgres" if role.startswith("postgres") else role] += seconds
    return {k: round(v, 1) for k, v in sorted(out.items())}


def split_cpus(usable: Iterable[int], spec: str) -> tuple[frozenset[int], frozenset[int]] | None:
    """(Director's CPUs, everybody else's) from `--cpus`: `auto` (the lowest usable CPU for
    Director, the rest for the others; None with fewer than two), `none` (None) or `A/B`
    (two CPU lists, e.g. `0/1` or `0/1-3`, disjoint and usable)."""
    from devenv.real_director.affinity import parse_cpus  # noqa: PLC0415

    have = frozenset(usable)
    if spec == "none":
        return None
    if spec == "auto":
        if len(have) < 2:
            return None
        first = min(have)
        return frozenset({first}), have - {first}
    director, sep, rest = spec.partition("/")
    if not sep:
        raise ValueError(f"--cpus {spec!r}: expected auto, none or DIRECTOR/OTHERS (e.g. 0/1)")
    mine, theirs = parse_cpus(director), parse_cpus(rest)
    if mine & theirs or not (mine | theirs) <= have:
        raise ValueError(f"--cpus {spec!r}: disjoint lists of the usable CPUs {sorted(have)}")
    return mine, theirs


def cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def busy_per_cpu(stat_text: str, ticks: int = CLOCK_TICKS) -> dict[int, float]:
    """CPU seconds each CPU was busy since boot (the `cpuN` lines of /proc/stat, everything but
    idle and iowait, guest time already in user time)."""
    out: dict[int, float] = {}
    for line in stat_text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            out[int(name[3:])] = (sum(values[:8]) - idle) / ticks
    return out


def busy_shares(
    before: Mapping[int, float], after: Mapping[int, float], seconds: float
) -> dict[str, float]:
    """Each CPU's busy share (0..1) between two readings of `busy_per_cpu`, keyed `cpuN`."""
    return {
        f"cpu{c}": round(min(1.0, max(0.0, (after[c] - before.get(c, 0.0)) / seconds)), 3)
        for c in sorted(after)
        if seconds > 0
    }


def others_cpu(machine_busy: float, ours: Mapping[str, float]) -> float:
    """CPU seconds the machine spent on processes the bench did not start (other engineers'
    tests): all busy time less what the bench's own processes used."""
    return round(max(0.0, machine_busy - sum(ours.values())), 1)


def capacity_bound(n: int, pairs_per_second: float) -> float:
    """Seconds Director needs for n register + token pairs at the rate it sustains."""
    return n / pairs_per_second


def admission_summary(rows: Sequence[Mapping[str, str]]) -> dict[str, dict[str, float]]:
    """Mean and max of each admission gauge sampled during a run (empty cells skipped)."""
    out: dict[str, dict[str, float]] = {}
    for name in ADMISSION_GAUGES:
        values = [float(r[name]) for r in rows if r.get(name) not in (None, "")]
        if values:
            out[name] = {
                "mean": round(sum(values) / len(values), 4),
                "max": round(max(values), 4),
            }
    return out


def merge_section(text: str, section: str) -> str:
    """`text` with the bench.real section replaced (`bench.report.merge_marked_section`)."""
    return merge_marked_section(text, section, begin=SECTION_BEGIN, end=SECTION_END)


# --- results -------------------------------------------------------------------------------------


@dataclass
class LostResult:
    target: str  # simulator | real Director
    n: int
    connected: int
    seconds: float | None
    answers_lost: int
    registrations: int
    duplicates: int
    director_calls: dict[str, int]
    calls_per_runtime: float | None
    attempts: dict[str, int]
    waited_after_seconds: float

    @property
    def met(self) -> bool:
        return (
            self.connected == self.n
            and self.duplicates == 0
            and self.calls_per_runtime is not None
            and self.calls_per_runtime <= CALLS_TARGET
        )


@dataclass
class CapacityResult:
    concurrency: int
    pairs: int
    seconds: float
    errors: int
    first_error: str = ""
    lookups: int = 0  # label look-ups before each registration, as the broker makes them
    cpu_busy: dict[str, float] = field(default_factory=dict)  # share per CPU, `cpuN`
    others_cpu_seconds: float | None = None  # other engineers' processes meanwhile
    load_after: float | None = None  # 1-minute load average at the end

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0


@dataclass
class RealColdResult:
    n: int
    broker_concurrency: int
    connected: int
    seconds: float | None
    pairs_per_second: float
    bound: float
    attempts: dict[str, int]
    agent_timeouts: int
    tokens_issued: int
    registrations: int
    duplicates: int
    director_calls: dict[str, int]
    calls_per_runtime: float | None
    cpu_seconds_by_process: dict[str, float]
    wall_seconds: float
    admission: dict[str, dict[str, float]] = field(default_factory=dict)
    # seconds from "go" until 25, 50, 75 and 100 % of N were connected (None: never)
    quartiles: list[float | None] = field(default_factory=list)
    broker_env: dict[str, str] = field(default_factory=dict)
    # the bound for the calls the broker made (look-ups, register, token), when measured
    same_calls_bound: float | None = None
    cpu_busy: dict[str, float] = field(default_factory=dict)  # share per CPU, `cpuN`
    others_cpu_seconds: float | None = None  # other engineers' processes meanwhile
    load_after: float | None = None  # 1-minute load average at the end

    @property
    def ratio(self) -> float | None:
        return None if self.seconds is None else self.seconds / self.bound

    @property
    def same_calls_ratio(self) -> float | None:
        if self.seconds is None or not self.same_calls_bound:
            return None
        return self.seconds / self.same_calls_bound


@dataclass
class AbRun:
    """One earlier `--scenarios real` run, read back from its benchmarks-real.json, in an
    interleaved comparison of variants (one bench at a time, in the order given)."""

    variant: str
    commit: str
    started: str
    load_before: float
    load_after: float | None
    others_cpu_seconds: float | None
    pairs_per_second: float
    seconds: float | None
    bound: float
    deferred: int  # 503 capacity-booked answers
    agent_timeouts: int
    tokens_issued: int
    duplicates: int

    @property
    def ratio(self) -> float | None:
        return None if self.seconds is None else self.seconds / self.bound


def ab_run(variant: str, data: Mapping[str, Any]) -> AbRun:
    """The comparison's figures of one run's JSON (`to_json`)."""
    cold = data["cold"]
    return AbRun(
        variant=variant,
        commit=str(data["commit"]),
        started=str(data["started"]),
        load_before=float(data["load_before"][0]),
        load_after=cold.get("load_after"),
        others_cpu_seconds=cold.get("others_cpu_seconds"),
        pairs_per_second=float(cold["pairs_per_second"]),
        seconds=cold["seconds"],
        bound=float(cold["bound"]),
        deferred=int(cold["attempts"].get("503 capacity-booked", 0)),
        agent_timeouts=int(cold["agent_timeouts"]),
        tokens_issued=int(cold["tokens_issued"]),
        duplicates=int(cold["duplicates"]),
    )


def ab_medians(runs: Sequence[AbRun]) -> dict[str, dict[str, float | int | None]]:
    """Per variant, in order of first appearance: runs, median time and ratio, the worst
    ratio, deferrals and agent timeouts in all (a run that never finished counts as worst)."""
    out: dict[str, dict[str, float | int | None]] = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant]
        ratios = [r.ratio for r in mine]
        finished = [x for x in ratios if x is not None]
        complete = len(finished) == len(ratios)
        out[variant] = {
            "runs": len(mine),
            "median_seconds": _median([r.seconds for r in mine]),
            "median_ratio": _median(ratios),
            "worst_ratio": max(finished) if finished and complete else None,
            "deferred": sum(r.deferred for r in mine),
            "agent_timeouts": sum(r.agent_timeouts for r in mine),
            "met": sum(1 for x in finished if x <= RATIO_TARGET),
        }
    return out


def _median(values: Sequence[float | None]) -> float | None:
    """The median, a missing value (a run that never finished) counting as the largest."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return None if low is None or high is None else (low + high) / 2


def kept_lost(previous: Mapping[str, Any] | None) -> tuple[list[LostResult], str]:
    """The lost-answer figures already in docs/benchmarks.json (key `real_director`) and the
    commit they were measured at, for a run that does not measure them again."""
    if not previous or not previous.get("lost"):
        return [], ""
    names = {f.name for f in fields(LostResult)}
    lost = [LostResult(**{k: v for k, v in r.items() if k in names}) for r in previous["lost"]]
    if previous.get("lost_measured_at"):  # itself carried over from an earlier run
        return lost, str(previous["lost_measured_at"])
    return lost, f"{previous.get('commit', '?')}, {previous.get('started', '?')}"


@dataclass
class RealReport:
    command: str
    commit: str
    started: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    lost: list[LostResult] = field(default_factory=list)
    capacity: list[CapacityResult] = field(default_factory=list)
    cold: RealColdResult | None = None
    notes: list[str] = field(default_factory=list)
    # who ran where: "Director, PostgreSQL, gateway" and "bench, KCP API server, broker, fleet"
    cpus: dict[str, str] = field(default_factory=dict)
    # `lost` not re-run: the figures already in the docs, and the commit they were measured at
    lost_from: str = ""
    ab: list[AbRun] = field(default_factory=list)  # earlier runs compared (`--ab`)
    finding: str = ""  # what the figures say (`--finding`), written by whoever ran them


def to_json(report: RealReport) -> dict[str, Any]:
    cold = report.cold
    return {
        "commit": report.commit,
        "command": report.command,
        "started": report.started,
        "load_before": [round(x, 2) for x in report.load_before],
        "load_after": [round(x, 2) for x in report.load_after],
        "cpus": report.cpus,
        "lost": [
            {
                **asdict(r),
                "calls_per_runtime": None
                if r.calls_per_runtime is None
                else round(r.calls_per_runtime, 3),
                "seconds": None if r.seconds is None else round(r.seconds, 2),
                "calls_per_runtime_target": CALLS_TARGET,
                "met": r.met,
            }
            for r in report.lost
        ],
        "capacity": [
            {**asdict(c), "pairs_per_second": round(c.pairs_per_second, 2)} for c in report.capacity
        ],
        "cold": None
        if cold is None
        else {
            **asdict(cold),
            "ratio": None if cold.ratio is None else round(cold.ratio, 3),
            "same_calls_ratio": None
            if cold.same_calls_ratio is None
            else round(cold.same_calls_ratio, 3),
            "ratio_target": RATIO_TARGET,
            "ratio_met": cold.ratio is not None and cold.ratio <= RATIO_TARGET,
        },
        "notes": report.notes,
        **({"lost_measured_at": report.lost_from} if report.lost_from else {}),
        **(
            {
                "ab": [{**asdict(r), "ratio": _round(r.ratio, 3)} for r in report.ab],
                "ab_medians": ab_medians(report.ab),
            }
            if report.ab
            else {}
        ),
        **({"finding": report.finding} if report.finding else {}),
    }


def _known(cls: type, record: Mapping[str, Any]) -> dict[str, Any]:
    """`record`'s keys that are fields of the dataclass `cls` (the JSON adds derived ones)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in record.items() if k in names}


def from_json(data: Mapping[str, Any]) -> RealReport:
    """The report `to_json` wrote, for rendering the section again without running anything
    (`--render-only`)."""
    cold = data.get("cold")
    return RealReport(
        command=str(data["command"]),
        commit=str(data["commit"]),
        started=str(data["started"]),
        load_before=tuple(data["load_before"]),  # type: ignore[arg-type]
        load_after=tuple(data["load_after"]),  # type: ignore[arg-type]
        lost=[LostResult(**_known(LostResult, r)) for r in data.get("lost", [])],
        capacity=[CapacityResult(**_known(CapacityResult, c)) for c in data.get("capacity", [])],
        cold=None if cold is None else RealColdResult(**_known(RealColdResult, cold)),
        notes=list(data.get("notes", [])),
        cpus=dict(data.get("cpus", {})),
        lost_from=str(data.get("lost_measured_at", "")),
        ab=[AbRun(**_known(AbRun, r)) for r in data.get("ab", [])],
        finding=str(data.get("finding", "")),
    )


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _busy(shares: Mapping[str, float]) -> str:
    return " / ".join(f"{k} {100 * v:.0f} %" for k, v in shares.items()) or "—"


def _calls(calls: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "none"


def render(report: RealReport) -> str:
    lines = [
        "## 11. Against the real Compass Director (issue 26)",
        "",
        f"Commit `{report.commit}`, {report.started}, `{report.command}` (setup: "
        "[real-compass.md](real-compass.md)); load average (1 min) "
        f"{report.load_before[0]:.2f} before, {report.load_after[0]:.2f} after.",
        "",
    ]
    if report.cpus:
        lines += [
            "CPU placement (`--cpus`): "
            + "; ".join(f"{who} on CPU {where}" for who, where in report.cpus.items())
            + ".",
            "",
        ]
    if report.lost:
        lines += [
            f"### Lost answers: {int(LOST_RATIO * 100)} % of `registerRuntime` answers lost "
            "after Director acted",
            "",
            *(
                [
                    f"Not re-run: measured at commit {report.lost_from}.",
                    "",
                ]
                if report.lost_from
                else []
            ),
            f"Met: 0 duplicates, ≤ {CALLS_TARGET:g} calls per runtime after the sweeps.",
            "",
            "| Director | N | connected | time to all | answers lost | registrations "
            "| duplicates | Director calls | calls / runtime | met |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report.lost:
            lines.append(
                f"| {r.target} | {r.n} | {r.connected} | {_f(r.seconds, 1)} s | "
                f"{r.answers_lost} | {r.registrations} | {r.duplicates} | "
                f"{_calls(r.director_calls)} | {_f(r.calls_per_runtime)} | "
                f"{'yes' if r.met else 'NO'} |"
            )
        lines += [""]
    if report.capacity:
        lines += [
            "### Director's own capacity here",
            "",
            "Pairs (`registerRuntime`, `requestOneTimeTokenForRuntime`) straight to the gateway; "
            "look-ups as the broker's for a runtime it cannot prove new.",
            "",
            "| concurrent callers | calls per runtime | runtimes | seconds | runtimes / s "
            "| calls / s | errors | CPU busy | others' CPU-s | load after |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in report.capacity:
            kinds = f"{c.lookups} look-ups + pair" if c.lookups else "pair"
            lines.append(
                f"| {c.concurrency} | {kinds} | {c.pairs} | {c.seconds:.1f} | "
                f"{c.pairs_per_second:.1f} | {(2 + c.lookups) * c.pairs_per_second:.1f} | "
                f"{c.errors} | {_busy(c.cpu_busy)} | "
                f"{_f(c.others_cpu_seconds, 1)} | {_f(c.load_after)} |"
            )
        lines += [""]
    cold = report.cold
    if cold is not None:
        ratio = cold.ratio
        lines += [
            f"### Cold start of N = {cold.n:,} through the broker",
            "",
            f"One broker, `BROKER_DIRECTOR_MAX_CONCURRENCY={cold.broker_concurrency}`; bound = "
            f"N / {cold.pairs_per_second:.1f} pairs/s (the capacity above at that concurrency).",
            "",
            "| figure | value | target | met |",
            "|---|---|---|---|",
            f"| connected | {cold.connected} of {cold.n} | all | "
            f"{'yes' if cold.connected == cold.n else 'NO'} |",
            f"| time to all connected | {_f(cold.seconds, 1)} s (bound {cold.bound:.1f} s, "
            f"{_f(ratio)}x) | ≤ {RATIO_TARGET}x | "
            f"{'yes' if ratio is not None and ratio <= RATIO_TARGET else 'NO'} |",
            *(
                [
                    f"| against Director's time for the calls the broker made | "
                    f"{_f(cold.same_calls_ratio)}x (bound {cold.same_calls_bound:.1f} s) | | |"
                ]
                if cold.same_calls_bound
                else []
            ),
            f"| agent timeouts | {cold.agent_timeouts} | 0 | "
            f"{'yes' if cold.agent_timeouts == 0 else 'NO'} |",
            f"| one-time tokens issued | {cold.tokens_issued} | {cold.n} | "
            f"{'yes' if cold.tokens_issued == cold.n else 'NO'} |",
            f"| duplicates in Director's database | {cold.duplicates} "
            f"({cold.registrations} registrations) | 0 | "
            f"{'yes' if cold.duplicates == 0 else 'NO'} |",
            f"| Director calls | {_calls(cold.director_calls)} "
            f"({_f(cold.calls_per_runtime)} per runtime) | | |",
            "",
            "Connected after (25 / 50 / 75 / 100 % of N): "
            + " / ".join("—" if q is None else f"{q:.1f} s" for q in cold.quartiles)
            + (
                "; broker settings: " + ", ".join(f"`{k}={v}`" for k, v in cold.broker_env.items())
                if cold.broker_env
                else ""
            )
            + ".",
            "",
            "Agent attempts: "
            + ", ".join(f"{k} {v}" for k, v in sorted(cold.attempts.items()))
            + ".",
            "",
            "CPU seconds by process over the run's "
            f"{cold.wall_seconds:.0f} s: "
            + ", ".join(
                f"{k} {v:.0f}"
                for k, v in sorted(cold.cpu_seconds_by_process.items(), key=lambda kv: -kv[1])
                if v >= 0.5
            )
            + f"; CPU busy {_busy(cold.cpu_busy)}; other processes on the machine "
            f"{_f(cold.others_cpu_seconds, 1)} CPU-s; load average at the end "
            f"{_f(cold.load_after)}.",
            "",
        ]
        if cold.admission:
            lines += [
                "Broker gauges, once a second (mean / max): "
                + "; ".join(
                    f"`{k}` {v['mean']:g} / {v['max']:g}" for k, v in cold.admission.items()
                )
                + ".",
                "",
            ]
    if report.notes:
        lines += [*(f"- {n}" for n in report.notes), ""]
    if report.ab:
        lines += render_ab(report.ab)
    if report.finding:
        lines += [report.finding.strip(), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_ab(runs: Sequence[AbRun]) -> list[str]:
    lines = [
        "### Interleaved runs compared (`--ab`)",
        "",
        "One `--scenarios real` run a row, in the order they ran; others' CPU-s: processes the "
        "bench did not start.",
        "",
        "| # | variant | commit | started | load | others' CPU-s | pairs / s | time to all "
        "| ratio | 503 capacity-booked | agent timeouts | tokens | duplicates |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r.variant} | `{r.commit}` | {r.started} | {r.load_before:.2f} → "
            f"{_f(r.load_after)} | {_f(r.others_cpu_seconds, 1)} | {r.pairs_per_second:.1f} | "
            f"{_f(r.seconds, 1)} s | {_f(r.ratio)}x | {r.deferred} | {r.agent_timeouts} | "
            f"{r.tokens_issued} | {r.duplicates} |"
        )
    lines += [
        "",
        f"| variant | runs | median time | median ratio | worst ratio | runs ≤ {RATIO_TARGET}x "
        "| deferrals | agent timeouts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, m in ab_medians(runs).items():
        lines.append(
            f"| {variant} | {m['runs']} | {_f(m['median_seconds'], 1)} s | "
            f"{_f(m['median_ratio'])}x | {_f(m['worst_ratio'])}x | {m['met']} | "
            f"{m['deferred']} | {m['agent_timeouts']} |"
        )
    return [*lines, ""]


# --- the real Director -----------------------------------------------------------------------


class RealTarget(Simulator):
    """The real Director seen through the bench's Simulator interface: what the brokers'
    credentials need; its calls are read from the gateway's counters, not a request log."""

    @classmethod
    def of(cls, compass: Any) -> RealTarget:
        return cls(
            child=cast(Child, None),  # the stack is stopped by whoever started it
            urls={"director_url": compass.director_url, "token_url": compass.token_url},
            secret=compass.client_secret,
            client_id=compass.client_id,
        )

    async def poll_calls(self, http: httpx.AsyncClient) -> int:
        return 0


def seed_tenants(compass: Any, n: int) -> None:
    """The global accounts and subaccounts of the bench's first n Kyma CRs, as the tenant
    fetcher would have synced them, in one psql run."""
    accounts = sorted({global_account(i) for i in range(n)})
    subaccounts = [f"sa-bench-{i:05d}" for i in range(n)]
    parents = [global_account(i) for i in range(n)]
    compass.database.psql(
        "INSERT INTO business_tenant_mappings "
        "(id, external_name, external_tenant, provider_name, type, status) "
        "SELECT gen_random_uuid(), t, t, :'provider', 'account', 'Active' "
        "FROM unnest(string_to_array(:'accounts', ',')) AS t;"
        "INSERT INTO business_tenant_mappings "
        "(id, external_name, external_tenant, provider_name, type, status) "
        "SELECT gen_random_uuid(), t, t, :'provider', 'subaccount', 'Active' "
        "FROM unnest(string_to_array(:'subaccounts', ',')) AS t;"
        "INSERT INTO tenant_parents (tenant_id, parent_id) SELECT c.id, p.id FROM "
        "unnest(string_to_array(:'subaccounts', ','), string_to_array(:'parents', ',')) "
        "AS x(s, g) JOIN business_tenant_mappings c ON c.external_tenant = x.s "
        "JOIN business_tenant_mappings p ON p.external_tenant = x.g;",
        {
            "provider": PROVIDER,
            "accounts": ",".join(accounts),
            "subaccounts": ",".join(subaccounts),
            "parents": ",".join(parents),
        },
        timeout=120.0,
    )


async def measure_capacity(
    compass: Any, *, pairs: int, concurrency: int, n_tenants: int, prefix: str, lookups: int = 0
) -> CapacityResult:
    """`pairs` register + token pairs straight to the gateway, `concurrency` at a time, each
    after the first `lookups` of the broker's look-ups (`LOOKUP_LABELS`)."""
    from control_plane_broker.director.documents import RUNTIMES_BY_LABEL  # noqa: PLC0415

    bearer = await asyncio.to_thread(compass.access_token)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(pairs):
        queue.put_nowait(i)
    errors = 0
    first_error = ""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def gql(http: httpx.AsyncClient, tenant: str, query: str, variables: Any) -> Any:
        response = await http.post(
            compass.director_url,
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {bearer}", "Tenant": tenant},
        )
        body = response.json() if response.status_code == 200 else {}
        if response.status_code != 200 or body.get("errors"):
            raise RuntimeError(f"{response.status_code} {str(body)[:200]}")
        return body["data"]

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal errors, first_error
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            index = i % n_tenants
            tenant = global_account(index)
            rid = f"{prefix}-{i:05d}"
            labels = {
                "director_connection_managed_by": "compass-broker",
                RUNTIME_ID_LABEL: rid,
                "broker_instance_id": f"inst-{rid}",
                "gardenerClusterName": f"c-{i:06d}",
                "global_subaccount_id": f"sa-bench-{index:05d}",
                "global_account_id": tenant,
                "broker_plan_id": "4deee563-e5ec-4731-b9b1-53b42d855f0c",
                "broker_plan_name": "azure",
            }
            spec = {"name": f"{prefix}-{i:05d}", "description": rid, "labels": labels}
            try:
                for key in LOOKUP_LABELS[:lookups]:
                    variables = {
                        "filter": [{"key": key, "query": json.dumps(labels[key])}],
                        "first": 100,
                        "after": None,
                    }
                    await gql(http, tenant, RUNTIMES_BY_LABEL, variables)
                data = await gql(http, tenant, REGISTER, {"in": spec})
                await gql(http, tenant, TOKEN, {"id": data["registerRuntime"]["id"]})
            except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as exc:
                errors += 1
                first_error = first_error or repr(exc)[:300]

    async with httpx.AsyncClient(timeout=60, limits=limits) as h:
        window = CpuWindow.open()
        started = time.monotonic()
        await asyncio.gather(*(worker(h) for _ in range(concurrency)))
        seconds = time.monotonic() - started
        cpu_busy, others, load = window.close()
    return CapacityResult(
        concurrency=concurrency,
        pairs=pairs,
        seconds=seconds,
        errors=errors,
        first_error=first_error,
        lookups=lookups,
        cpu_busy=cpu_busy,
        others_cpu_seconds=others,
        load_after=load,
    )


@dataclass
class CpuWindow:
    """Per-CPU busy time and the bench's own processes' CPU over a stretch of time: how busy
    each core was, and what the machine spent on other people's processes meanwhile."""

    busy: dict[int, float]
    snapshot: CpuSnapshot

    @classmethod
    def open(cls) -> CpuWindow:
        return cls(busy_per_cpu(Path("/proc/stat").read_text()), CpuSnapshot.take())

    def close(self) -> tuple[dict[str, float], float, float]:
        """(busy share per CPU, other processes' CPU seconds, 1-minute load average)."""
        after = CpuSnapshot.take()
        busy = busy_per_cpu(Path("/proc/stat").read_text())
        seconds = after.at - self.snapshot.at
        ours = cpu_by_role(self.snapshot, after)
        others = others_cpu(after.machine_busy - self.snapshot.machine_busy, ours)
        return busy_shares(self.busy, busy, seconds), others, os.getloadavg()[0]


def losses_due(registrations_seen: int, ratio: float, total: int) -> int:
    """How many lost answers should have been armed once `registrations_seen` registerRuntime
    calls reached the simulator: one in every 1/ratio, at most `total`."""
    return min(total, int(registrations_seen * ratio) + 1)


async def interleave_losses(
    sim: Simulator, http: httpx.AsyncClient, total: int, stop: asyncio.Event
) -> int:
    """Spreads the simulator's counted lost responses over the run: one armed at a time, the
    next once it fired and the registrations seen call for it (the simulator has no ratio;
    arming all at once would lose the first 30 % in a row, which to any broker looks like
    Compass being down). Reads the calls the run's monitor polls. Returns how many it armed."""
    armed = 0
    while not stop.is_set() and armed < total:
        seen = sum(1 for c in sim.director_calls if c.operation == "registerRuntime")
        if armed < losses_due(seen, LOST_RATIO, total):
            faults = await sim.get(http, "faults")
            if not (faults.get("lost_responses") or {}).get("registerRuntime"):
                await sim.patch_faults(http, lost_responses={"registerRuntime": 1})
                armed += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    return armed


def _admission_rows(workdir: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(workdir.glob("admission-*.csv")):
        with path.open() as f:
            rows += list(csv.DictReader(f))
    return rows


class RealBench:
    def __init__(
        self,
        bench: Bench,
        kcp_cluster: Any,
        progress: Progress,
        director_cpus: frozenset[int] | None = None,
    ) -> None:
        self.bench = bench
        self.kcp_cluster = kcp_cluster
        self.progress = progress
        self.director_folder: Path | None = None
        self.director_cpus = director_cpus  # Director, PostgreSQL, the gateway (None: anywhere)

    def start_compass(self, name: str, n: int) -> Any:
        from devenv.real_director import stack as real  # noqa: PLC0415

        if self.director_folder is None:
            self.director_folder = real.build_director()
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.bench.config.workdir))
        compass = real.start_real_compass(
            workdir,
            cluster=self.kcp_cluster,
            director_folder=self.director_folder,
            cpus=self.director_cpus,
        )
        try:
            seed_tenants(compass, n)
        except BaseException:
            compass.stop()
            raise
        self.progress.say(f"{name}: real Director up ({compass.timings.get('total', 0):.1f} s)")
        return compass

    async def _settle(self) -> float:
        waited = SWEEPS_WAITED * SWEEP_SECONDS + 2.0
        self.progress.say(f"waiting {waited:.0f} s for {SWEEPS_WAITED} reconciler sweeps")
        await asyncio.sleep(waited)
        return waited

    async def lost_simulator(self, n: int) -> LostResult:
        bench = self.bench
        spec = RunSpec("lost", n, bench.plan.latency)
        tokens = await bench.tokens_for(spec, bench.keys[:n])
        lose = round(n * LOST_RATIO)
        env = {"BROKER_SWEEP_INTERVAL_SECONDS": str(SWEEP_SECONDS)}
        async with bench.stack(spec, capacity=bench.plan.capacity, broker_env=env) as run:
            async with httpx.AsyncClient(timeout=30) as http:
                stop = asyncio.Event()
                losing = asyncio.create_task(interleave_losses(run.sim, http, lose, stop))
                try:
                    m = await bench._fleet(
                        run,
                        bench.agents(run, tokens),
                        deadline=planning.deadline(bench.plan, spec),
                    )
                finally:
                    stop.set()
                    armed = await losing
                waited = await self._settle()
                await run.sim.poll_calls(http)
                runtimes: list[dict[str, Any]] = await run.sim.get(http, "runtimes")
                faults = await run.sim.get(http, "faults")
            left = int((faults.get("lost_responses") or {}).get("registerRuntime", 0))
        calls = dict(Counter(c.operation for c in run.sim.director_calls))
        ours = registrations_of(runtimes, run.runtime_ids)
        return self._lost_result("simulator", n, m.fleet, calls, ours, armed - left, waited)

    async def lost_real(self, n: int) -> LostResult:
        bench = self.bench
        spec = RunSpec("lost", n, 0.0)
        tokens = await bench.tokens_for(spec, bench.keys[:n])
        compass = await asyncio.to_thread(self.start_compass, "lost-real", n)
        try:
            env = {"BROKER_SWEEP_INTERVAL_SECONDS": str(SWEEP_SECONDS)}
            target = RealTarget.of(compass)
            before = compass.calls()
            async with bench.stack(
                spec, capacity=bench.plan.capacity, target=target, broker_env=env
            ) as run:
                compass.lose_answers("registerRuntime", ratio=LOST_RATIO)
                m = await bench._fleet(
                    run, bench.agents(run, tokens), deadline=planning.deadline(bench.plan, spec)
                )
                waited = await self._settle()
                calls = call_delta(before, compass.calls())
                lost = compass.lost().get("registerRuntime", 0)
                runtimes = await asyncio.to_thread(compass.runtimes, label_key=RUNTIME_ID_LABEL)
            ours = registrations_of(runtimes, run.runtime_ids)
            return self._lost_result("real Director", n, m.fleet, calls, ours, lost, waited)
        finally:
            compass.stop()

    @staticmethod
    def _lost_result(
        target: str,
        n: int,
        fleet: Any,
        calls: dict[str, int],
        ours: Sequence[Mapping[str, Any]],
        lost: int,
        waited: float,
    ) -> LostResult:
        return LostResult(
            target=target,
            n=n,
            connected=fleet.connected,
            seconds=stats.completion_time(
                list(fleet.connected_at.values()), since=fleet.started_at, expected=n
            ),
            answers_lost=lost,
            registrations=len(ours),
            duplicates=duplicates_by_label(ours),
            director_calls=dict(sorted(calls.items())),
            calls_per_runtime=calls_per_runtime(calls, n),
            attempts=dict(sorted(fleet.attempts.items())),
            waited_after_seconds=waited,
        )

    async def slow_real(
        self, n: int, *, latency: tuple[float, float], commit: str, note: str = ""
    ) -> slow.SlowRun:
        """A cold start of n through one broker while each Director call takes `latency`
        (min, max) seconds at the gateway (`bench.slow`)."""
        bench = self.bench
        spec = RunSpec("slow-real", n, 0.0)
        tokens = await bench.tokens_for(spec, bench.keys[:n])
        compass = await asyncio.to_thread(self.start_compass, "slow-real", n)
        try:
            started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            load_before = os.getloadavg()[0]
            before = compass.calls()
            bound = slow.latency_bound(
                n, latency=sum(latency) / 2, slots=bench.plan.broker_concurrency
            )
            async with bench.stack(
                spec, capacity=bench.plan.capacity, target=RealTarget.of(compass)
            ) as run:
                compass.set_latency(*latency)
                m = await bench._fleet(
                    run, bench.agents(run, tokens), deadline=max(600.0, 4 * bound)
                )
                compass.set_latency(None)
                calls = call_delta(before, compass.calls())
                runtimes = await asyncio.to_thread(compass.runtimes, label_key=RUNTIME_ID_LABEL)
                rows = _admission_rows(run.workdir)
            fleet = m.fleet
            return slow.result_from_gauges(
                target="real Director",
                commit=commit,
                started=started,
                n=n,
                slots=bench.plan.broker_concurrency,
                latency=latency,
                connected=fleet.connected,
                seconds=stats.completion_time(
                    list(fleet.connected_at.values()), since=fleet.started_at, expected=n
                ),
                connect_times=[t - fleet.started_at for t in fleet.connected_at.values()],
                samples=[
                    {k: float(v) for k, v in row.items() if v not in (None, "")} for row in rows
                ],
                since=fleet.started_at,
                calls=calls,
                attempts=dict(fleet.attempts),
                duplicates=duplicates_by_label(registrations_of(runtimes, run.runtime_ids)),
                load=(load_before, os.getloadavg()[0]),
                note=note,
            )
        finally:
            compass.stop()

    async def cut_real(self, n: int, *, commit: str, note: str = "") -> sessions_cut.CutRun:
        """A cold start of n through one broker while Director's database sessions are ended
        every 0.5 s for 20 s, from the moment a quarter of the fleet is registered."""
        bench = self.bench
        spec = RunSpec("cut-real", n, 0.0)
        tokens = await bench.tokens_for(spec, bench.keys[:n])
        compass = await asyncio.to_thread(self.start_compass, "cut-real", n)
        cutter: Any = None
        try:
            started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            before = compass.calls()
            async with bench.stack(
                spec, capacity=bench.plan.capacity, target=RealTarget.of(compass)
            ) as run:

                async def cut_when_a_quarter_is_registered() -> Any:
                    while True:
                        done = call_delta(before, compass.calls()).get("registerRuntime", 0)
                        if done >= n // 4:
                            self.progress.say(f"{done} registered: cutting Director's sessions")
                            return compass.cut_sessions(
                                every=sessions_cut.EVERY_SECONDS,
                                for_seconds=sessions_cut.FOR_SECONDS,
                            )
                        await asyncio.sleep(0.05)

                cutting = asyncio.create_task(cut_when_a_quarter_is_registered())
                try:
                    m = await bench._fleet(run, bench.agents(run, tokens), deadline=600.0)
                finally:
                    if not cutting.done():
                        cutting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        cutter = await cutting
                if cutter is not None:
                    await asyncio.to_thread(cutter.wait)
                calls = call_delta(before, compass.calls())
                runtimes = await asyncio.to_thread(compass.runtimes, label_key=RUNTIME_ID_LABEL)
            ours = registrations_of(runtimes, run.runtime_ids)
            fleet = m.fleet
            return sessions_cut.CutRun(
                commit=commit,
                started=started,
                n=n,
                every=sessions_cut.EVERY_SECONDS,
                for_seconds=sessions_cut.FOR_SECONDS,
                connected=fleet.connected,
                seconds=stats.completion_time(
                    list(fleet.connected_at.values()), since=fleet.started_at, expected=n
                ),
                rounds=cutter.rounds if cutter is not None else 0,
                sessions_ended=cutter.terminated if cutter is not None else 0,
                registrations=len(ours),
                duplicates=duplicates_by_label(ours),
                director_calls=dict(sorted(calls.items())),
                attempts=dict(sorted(fleet.attempts.items())),
                note=note,
            )
        finally:
            if cutter is not None:
                cutter.stop()
            compass.stop()

    async def real_cold(self, n: int, *, pairs: int, report: RealReport) -> RealColdResult:
        bench = self.bench
        plan = bench.plan
        spec = RunSpec("cold-real", n, 0.0)
        tokens = await bench.tokens_for(spec, bench.keys[:n])
        compass = await asyncio.to_thread(self.start_compass, "cold-real", n)
        try:
            measurements = [
                (plan.broker_concurrency, 0),
                (plan.capacity, 0),
                (plan.broker_concurrency, len(LOOKUP_LABELS)),
            ]
            for concurrency, lookups in measurements:
                self.progress.say(f"measuring Director's capacity at {concurrency} callers")
                result = await measure_capacity(
                    compass,
                    pairs=pairs,
                    concurrency=concurrency,
                    n_tenants=n,
                    prefix=f"capacity{concurrency}-{lookups}",
                    lookups=lookups,
                )
                self.progress.say(
                    f"Director capacity at {concurrency} callers: "
                    f"{result.pairs_per_second:.1f} runtimes/s with {lookups} look-ups "
                    f"({result.errors} errors)"
                )
                report.capacity.append(result)
                if result.errors:
                    raise RuntimeError(f"measuring Director's capacity: {result.first_error}")
            rate = report.capacity[0].pairs_per_second
            deadline = max(300.0, 10 * capacity_bound(n, rate))
            before = compass.calls()
            async with bench.stack(
                spec, capacity=plan.capacity, target=RealTarget.of(compass)
            ) as run:
                window = CpuWindow.open()
                m = await bench._fleet(run, bench.agents(run, tokens), deadline=deadline)
                cpu_busy, _, load = window.close()
                calls = call_delta(before, compass.calls())
                runtimes = await asyncio.to_thread(compass.runtimes, label_key=RUNTIME_ID_LABEL)
                admission = admission_summary(_admission_rows(run.workdir))
            ours = registrations_of(runtimes, run.runtime_ids)
            fleet = m.fleet
            return RealColdResult(
                n=n,
                broker_concurrency=plan.broker_concurrency,
                connected=fleet.connected,
                seconds=stats.completion_time(
                    list(fleet.connected_at.values()), since=fleet.started_at, expected=n
                ),
                pairs_per_second=rate,
                bound=capacity_bound(n, rate),
                attempts=dict(sorted(fleet.attempts.items())),
                agent_timeouts=agent_timeouts(fleet.attempts),
                tokens_issued=calls.get("requestOneTimeTokenForRuntime", 0),
                registrations=len(ours),
                duplicates=duplicates_by_label(ours),
                director_calls=calls,
                calls_per_runtime=calls_per_runtime(calls, n),
                cpu_seconds_by_process=cpu_by_program(m.cpu.by_role),
                wall_seconds=m.cpu.wall_seconds,
                admission=admission,
                quartiles=quartiles([t - fleet.started_at for t in fleet.connected_at.values()], n),
                broker_env=dict(bench.config.broker_env),
                same_calls_bound=capacity_bound(n, report.capacity[-1].pairs_per_second)
                if calls.get("runtimes", 0) >= len(LOOKUP_LABELS) * n
                else None,
                cpu_busy=cpu_busy,
                others_cpu_seconds=others_cpu(m.cpu.machine_busy, m.cpu.by_role),
                load_after=load,
            )
        finally:
            compass.stop()


# --- the command ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.real",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--scenarios",
        default="lost,real",
        help="lost, real, slow, cut, comma-separated (default lost,real); `slow` and `cut` "
        "alone with --docs rewrite only their own sections of docs/benchmarks.md",
    )
    add("--lost-n", type=int, default=LOST_N, help=f"runtimes of `lost` (default {LOST_N})")
    add("--n", type=int, default=REAL_N, help=f"runtimes of the real cold start ({REAL_N})")
    add("--pairs", type=int, default=CAPACITY_PAIRS, help="pairs of the capacity measurement")
    add("--cut-n", type=int, default=sessions_cut.DEFAULT_N, help="runtimes of `cut` (200)")
    add("--slow-n", type=int, default=slow.DEFAULT_N, help="runtimes of `slow` (default 200)")
    add(
        "--slow-latency",
        default="-".join(f"{v:g}" for v in slow.DEFAULT_LATENCY),
        metavar="MIN-MAX",
        help="seconds each Director call takes in `slow` (default 3-5)",
    )
    add("--capacity", type=int, default=8, help="Director capacity C of the bench (default 8)")
    add("--broker-concurrency", type=int, default=None, help="default C + C/4")
    add("--out-dir", type=Path, default=None, help="where the json and md go (default: temp)")
    add("--docs", action="store_true", help="also merge into docs/benchmarks.md and .json")
    add(
        "--broker-env",
        action="append",
        default=[],
        metavar="BROKER_X=VALUE",
        help="extra broker setting (repeatable), shown in the report",
    )
    add("--keep-workdir", action="store_true", help="keep logs and admission-*.csv")
    add(
        "--ab",
        action="append",
        default=[],
        metavar="VARIANT=DIR",
        help="an earlier --scenarios real run (its --out-dir) to show in a comparison of "
        "variants, repeatable, in the order they ran",
    )
    add(
        "--finding",
        type=Path,
        default=None,
        help="a file whose text ends the section: one paragraph of what the figures show, "
        "linking the design record that tells how it was found",
    )
    add(
        "--render-only",
        action="store_true",
        help="run nothing: write sections 11-13 of docs/benchmarks.md again from "
        "docs/benchmarks.json (after a change of their text; with --finding, a new finding)",
    )
    add(
        "--cpus",
        default="auto",
        metavar="auto|none|DIRECTOR/OTHERS",
        help="CPU placement: Director, PostgreSQL and the gateway on DIRECTOR, the bench, KCP, "
        "brokers and fleet on OTHERS (e.g. 0/1); auto: the lowest CPU for Director, the rest "
        "for the others (none with fewer than two CPUs); none: no affinity (default auto)",
    )
    return parser


def render_docs(docs: Path, finding: str | None = None) -> None:
    """Sections 11-13 of `docs`/benchmarks.md written again from the figures benchmarks.json
    keeps for them; `finding`, if given, replaces the kept one in both files."""
    md, path = docs / "benchmarks.md", docs / "benchmarks.json"
    data = json.loads(path.read_text())
    text = md.read_text()
    if JSON_KEY in data:
        report = from_json(data[JSON_KEY])
        if finding is not None:
            report.finding = finding
            data[JSON_KEY] = to_json(report)
        text = merge_section(text, render(report))
    if slow.JSON_KEY in data:
        text = slow.merge_section(text, slow.render(slow.from_json(data[slow.JSON_KEY])))
    if sessions_cut.JSON_KEY in data:
        runs = sessions_cut.from_json(data[sessions_cut.JSON_KEY])
        text = sessions_cut.merge_section(text, sessions_cut.render(runs))
    md.write_text(text)
    path.write_text(json.dumps(data, indent=1) + "\n")


def merge_into_docs(report: RealReport, docs: Path) -> None:
    md = docs / "benchmarks.md"
    md.write_text(merge_section(md.read_text(), render(report)))
    path = docs / "benchmarks.json"
    data = json.loads(path.read_text())
    data[JSON_KEY] = to_json(report)
    path.write_text(json.dumps(data, indent=1) + "\n")


async def run_all(args: argparse.Namespace, out_dir: Path, workdir: Path) -> RealReport:
    from bench.__main__ import broker_concurrency_for, raise_open_files_limit, revision, start_jwks  # noqa: PLC0415
    from devenv.clusters import find_binaries, kyma_crds, start_cluster  # noqa: PLC0415

    progress = Progress()
    chosen = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    commit, uncommitted = revision()
    report = RealReport(
        command=recorded_command("python -m bench.real", sys.argv[1:]),
        commit=commit + (f" (uncommitted: {', '.join(uncommitted)})" if uncommitted else ""),
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load_before=os.getloadavg(),
    )
    report.ab = [
        ab_run(variant, json.loads((Path(folder) / "benchmarks-real.json").read_text()))
        for variant, _, folder in (item.partition("=") for item in args.ab)
    ]
    if args.finding is not None:
        report.finding = args.finding.read_text()
    if "lost" not in chosen:
        with contextlib.suppress(OSError, ValueError):
            docs_json = json.loads((REPO_ROOT / "docs" / "benchmarks.json").read_text())
            report.lost, report.lost_from = kept_lost(docs_json.get(JSON_KEY))
    placement: tuple[frozenset[int], frozenset[int]] | None = args.placement
    if placement is not None:
        report.cpus = {
            "Director, PostgreSQL, gateway": cpu_list(placement[0]),
            "bench, KCP API server, broker, fleet": cpu_list(placement[1]),
        }
    concurrency = args.broker_concurrency or broker_concurrency_for(args.capacity)
    plan = Plan(
        capacity=args.capacity,
        broker_concurrency=concurrency,
        latency=0.1,
        outage_seconds=60.0,
        sizes=(),
        legacy_latency=0.05,
        legacy_sizes=(),
        identity_sizes=(),
        tokenreview_clusters=1,
        replica_sizes=(),
        replicas=1,
        steady_runtimes=0,
        steady_callers=1,
        report_runtimes=0,
        report_heartbeat=300.0,
        report_window=60.0,
        fleet_processes=1,
        max_run_seconds=1800.0,
        scenarios=(),
    )
    n_max = max(
        args.lost_n if "lost" in chosen else 0,
        args.n if "real" in chosen else 0,
        args.slow_n if "slow" in chosen else 0,
        args.cut_n if "cut" in chosen else 0,
        1,
    )
    slow_runs: list[slow.SlowRun] = []
    cut_runs: list[sessions_cut.CutRun] = []
    raise_open_files_limit(n_max + 1024)

    def save() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if slow_runs:
            slow.merge_docs(out_dir, slow_runs, report="benchmarks-slow.md", data_file="slow.json")
            if args.docs:
                docs = REPO_ROOT / "docs"
                slow.merge_docs(
                    docs, slow_runs, report="benchmarks.md", data_file="benchmarks.json"
                )
        if cut_runs:
            sessions_cut.merge_docs(
                out_dir, cut_runs, report="benchmarks-cut.md", data_file="cut.json"
            )
            if args.docs:
                sessions_cut.merge_docs(
                    REPO_ROOT / "docs",
                    cut_runs,
                    report="benchmarks.md",
                    data_file="benchmarks.json",
                )
        if chosen <= {"slow", "cut"}:
            return  # the section of the other scenarios stays as it was
        report.load_after = os.getloadavg()
        (out_dir / "benchmarks-real.json").write_text(json.dumps(to_json(report), indent=1) + "\n")
        (out_dir / "benchmarks-real.md").write_text(render(report))
        if args.docs:
            merge_into_docs(report, REPO_ROOT / "docs")
        progress.say(f"wrote {out_dir / 'benchmarks-real.md'}")

    binaries = await asyncio.to_thread(find_binaries)
    kcp_cluster = await asyncio.to_thread(
        start_cluster, "bench-kcp", binaries, workdir=workdir / "kcp"
    )
    jwks: Child | None = None
    try:
        crds = [*kyma_crds(), *sorted((REPO_ROOT / "charts/compass-broker/crds").glob("*.yaml"))]
        await asyncio.to_thread(kcp_cluster.apply_crds, crds)
        keys = new_runtime_keys(n_max)
        jwks, template = start_jwks(keys, workdir)
        bench = Bench(
            BenchConfig(
                plan=plan,
                down_mode="503",
                idle_seconds=0.0,
                workdir=workdir,
                broker_env=dict(item.split("=", 1) for item in args.broker_env),
            ),
            kcp=ApiServer(kcp_cluster.kubeconfig_path, workdir / "kcp-client"),
            keys=keys,
            jwks_template=template,
            progress=progress,
        )
        real = RealBench(
            bench, kcp_cluster, progress, director_cpus=placement[0] if placement else None
        )
        if "lost" in chosen:
            report.lost.append(await real.lost_simulator(args.lost_n))
            save()
            report.lost.append(await real.lost_real(args.lost_n))
            save()
        if "real" in chosen:
            report.cold = await real.real_cold(args.n, pairs=args.pairs, report=report)
            save()
        if "slow" in chosen:
            low, _, high = args.slow_latency.partition("-")
            slow_runs.append(
                await real.slow_real(
                    args.slow_n,
                    latency=(float(low), float(high or low)),
                    commit=commit,
                    note=f"uncommitted changes in {', '.join(uncommitted)}" if uncommitted else "",
                )
            )
            save()
        if "cut" in chosen:
            cut_runs.append(
                await real.cut_real(
                    args.cut_n,
                    commit=commit,
                    note=f"uncommitted changes in {', '.join(uncommitted)}" if uncommitted else "",
                )
            )
            save()
    finally:
        if jwks is not None:
            jwks.stop()
        kcp_cluster.stop()
    report.notes.append(
        f"`lost`: the simulator loses one registerRuntime answer in every "
        f"{1 / LOST_RATIO:.1f}, the real Director's gateway each with probability "
        f"{LOST_RATIO}; sweeps every {SWEEP_SECONDS:g} s, calls counted {SWEEPS_WAITED} sweeps "
        "after the last runtime connected."
    )
    save()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.render_only:
        render_docs(REPO_ROOT / "docs", None if args.finding is None else args.finding.read_text())
        return 0
    try:
        args.placement = split_cpus(os.sched_getaffinity(0), args.cpus)
    except ValueError as exc:
        parser.error(str(exc))
    if args.placement is not None:
        # Before any thread or child exists: all of them inherit it (Director's side is
        # started from a thread moved to its CPUs, devenv/real_director/affinity.py).
        os.sched_setaffinity(0, args.placement[1])
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="bench-real-out-"))
    workdir = Path(tempfile.mkdtemp(prefix="bench-real-"))

    try:
        if not run_until_stopped(run_all(args, out_dir, workdir)):
            return 130
    finally:
        if args.keep_workdir:
            print(f"work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"report: {out_dir / 'benchmarks-real.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
