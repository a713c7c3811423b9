"""Where the broker's CPU goes in one run: py-spy sampling from outside, cProfile as fallback.

py-spy attaches to the running broker by PID (ptrace) with `--nonblocking`, so the broker is
never paused and its figures stay those of an unprofiled run (py-spy's own CPU is recorded as
a process of its own). Only when py-spy cannot attach here (no ptrace, no binary), or when
`BENCH_PROFILER=cprofile` asks for it, the broker of that run is started under cProfile
instead, and the report says so: cProfile slows every Python call, so that run's figures are
not representative.

The summaries are pure functions of the profile files: top frames by own time (samples with
the frame innermost), and which broker code (innermost `control_plane_broker` frame) led there.
"""

from __future__ import annotations

import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.results import FleetRunResult

PROFILER_ENV = "BENCH_PROFILER"  # "cprofile" forces the fallback
BROKER_PACKAGE = "control_plane_broker"
TOP = 5
_STDLIB = re.compile(r"/lib/python3\.\d+/")
_LINE = re.compile(r"^(?P<frame>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class FrameShare:
    frame: str  # `function (path)`, line numbers merged
    share: float  # of all samples (py-spy) or of all own time (cProfile), 0..1
    seconds: float | None = None  # cProfile only: own time


@dataclass(frozen=True)
class ProfileSummary:
    tool: str  # py-spy | cProfile
    run: str  # which run was profiled
    samples: int  # py-spy samples (0 for cProfile)
    top_own: list[FrameShare]
    top_broker: list[FrameShare] = field(default_factory=list)
    note: str = ""  # why the fallback was used, or what went wrong
    file: str = ""


def profiled_run(summary: ProfileSummary, run: FleetRunResult) -> ProfileSummary:
    """The summary, naming what the profiled repeat achieved under the profiler: its figures
    stay out of the tables, but a reader should see how much the profiler slowed it."""
    ratio = run.ratio
    outcome = f"{run.connected:,}/{run.n:,} connected" + (
        f" in {run.time:.1f} s, {ratio:.2f}x the bound" if run.time is not None and ratio else ""
    )
    return replace(
        summary,
        run=f"{summary.run} (a repeat of its own, not in the tables: {outcome})",
    )


def frame_name(raw: str) -> str:
    """`func (path/to/file.py:123)` -> `func (to/file.py)`: one entry per function."""
    match = _LINE.match(raw.strip())
    if match is None:
        return raw.strip()
    path = match["file"]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif _STDLIB.search(path):
        path = _STDLIB.split(path, 1)[1]
    else:
        parts = Path(path).parts
        path = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{match['frame']} ({path})"


def summarise_collapsed(
    text: str, *, top: int = TOP
) -> tuple[int, list[FrameShare], list[FrameShare]]:
    """py-spy's raw (collapsed) output: `frame;frame;...;innermost count` per line.

    Returns (samples, top frames by own time, top innermost broker frames)."""
    own: Counter[str] = Counter()
    broker: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frame_name(frames[-1])] += count
        ours = [f for f in frames if BROKER_PACKAGE in f]
        if ours:
            broker[frame_name(ours[-1])] += count
    if not total:
        return 0, [], []

    def shares(counter: Counter[str]) -> list[FrameShare]:
        return [FrameShare(frame=f, share=c / total) for f, c in counter.most_common(top)]

    return total, shares(own), shares(broker)


def summarise_cprofile(path: Path, *, top: int = TOP) -> list[FrameShare]:
    stats = pstats.Stats(str(path))
    entries = stats.stats  # type: ignore[attr-defined]  # (file, line, func) -> (cc, nc, tt, ct, callers)
    # Waiting in epoll is idle time, which py-spy leaves out too.
    busy = {k: v for k, v in entries.items() if "select.epoll" not in k[2]}
    total = sum(v[2] for v in busy.values()) or 1.0
    ranked = sorted(busy.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        FrameShare(
            frame=frame_name(f"{func} ({file}:{line})"), share=v[2] / total, seconds=float(v[2])
        )
        for (file, line, func), v in ranked
    ]


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # installed into the same environment
    return str(beside) if beside.exists() else shutil.which("py-spy")


def py_spy_problem(pid: int) -> str | None:
    """Why py-spy cannot sample `pid` here (None: it can), checked with a one-off dump."""
    if os.environ.get(PROFILER_ENV, "").lower() == "cprofile":
        return f"{PROFILER_ENV}=cprofile was set"
    binary = py_spy()
    if binary is None:
        return "py-spy is not installed (pip install -e '.[bench]')"
    try:
        result = subprocess.run(
            [binary, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy could not run: {exc!r}"
    if result.returncode != 0:
        return f"py-spy could not attach: {(result.stderr or result.stdout).strip()[:300]}"
    return None


class PySpyRecorder:
    """`py-spy record` on one PID until `stop()`; writes collapsed stacks to `output`."""

    def __init__(self, pid: int, output: Path, log_path: Path, *, rate: int = 100) -> None:
        binary = py_spy()
        if binary is None:
            raise RuntimeError("py-spy is not installed")
        self.output = output
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--output",
                str(output),
                "--nonblocking",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )

    def stop(self, timeout: float = 60.0) -> str:
        """Ends sampling (SIGINT makes py-spy write its output); returns the collapsed text."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._log.close()
        try:
            return self.output.read_text()
        except OSError:
            return ""

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-500:]
        except OSError:
            return ""
