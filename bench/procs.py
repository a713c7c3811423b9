"""The processes a benchmark runs and what it reads from them.

Holds: every child process is started on 127.0.0.1 with a free port, its output goes to a log
file in the run's work folder (never to our terminal), and `stop()` ends it by its own PID
(SIGTERM, then SIGKILL after a grace period). CPU and memory figures come from
`/proc/<pid>/stat` and `/proc/<pid>/status` of that PID only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def run_until_stopped(run: Coroutine[Any, Any, object]) -> bool:
    """Runs a benchmark to its end (True), or until Ctrl-C or SIGTERM (False). Both cancel it the
    same way (asyncio.run's own handling of SIGINT, and a handler for SIGTERM), so every stack
    it started is stopped on the way out; a plain SIGTERM would leave the children, each in a
    session of its own, running."""

    async def until_stopped() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await run

    previous = signal.getsignal(signal.SIGTERM)
    try:
        asyncio.run(until_stopped())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("stopped: everything the run started is stopped", file=sys.stderr)
        return False
    finally:
        signal.signal(signal.SIGTERM, previous)  # closing the loop left the default there
    return True


@dataclass(frozen=True)
class ProcSample:
    cpu_seconds: float  # user + system
    rss_bytes: int
    peak_rss_bytes: int  # VmHWM: high-water mark since the process started


def parse_stat_cpu(stat_text: str, ticks: int = CLOCK_TICKS) -> float:
    """utime + stime (fields 14 and 15) of /proc/<pid>/stat, in seconds.

    The command name (field 2) may hold spaces and parentheses, so fields are counted after
    the last ')'.
    """
    rest = stat_text[stat_text.rindex(")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])  # fields 14, 15 (rest starts at field 3)
    return (utime + stime) / ticks


def parse_status_kib(status_text: str, key: str) -> int:
    """A `VmRSS:`-style line of /proc/<pid>/status in bytes (0 when absent)."""
    for line in status_text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def parse_machine_busy(stat_text: str, ticks: int = CLOCK_TICKS) -> float:
    """CPU seconds all cores together were busy since boot, from the `cpu` line of /proc/stat
    (everything but idle and iowait)."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            # guest time is already part of user time: count the first eight fields only
            return (sum(values[:8]) - idle) / ticks
    raise ValueError("no cpu line in /proc/stat")


def machine_busy_seconds() -> float:
    return parse_machine_busy(Path("/proc/stat").read_text())


def process_role(cmdline: Sequence[str]) -> str:
    """A short name for a process the benchmark started, from its command line."""
    if not cmdline:
        return "other"
    program = Path(cmdline[0]).name
    if program in ("kube-apiserver", "etcd", "py-spy"):
        return program
    modules = {
        "control_plane_broker": "broker",
        "devenv.compass_sim": "compass-sim",
        "bench.fleet": "fleet",
        "bench.jwks_server": "jwks-server",
        "agent": "agent",
    }
    args = list(cmdline[1:])
    # `python -m cProfile -o X -m control_plane_broker`: the last `-m` names the program.
    named = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]
    if named and named[-1] in modules:
        return modules[named[-1]]
    return program


def parse_ppid(stat_text: str) -> int:
    return int(stat_text[stat_text.rindex(")") + 2 :].split()[1])


def descendants(root: int) -> dict[int, str]:
    """PID -> role of every living process below `root` (children, grandchildren, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = parse_ppid((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # gone meanwhile
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    roles: dict[int, str] = {}
    for pid in below:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        roles[pid] = process_role([a.decode(errors="replace") for a in raw.split(b"\0") if a])
    return roles


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of each process below the benchmark and of the whole machine at a moment."""

    at: float  # monotonic
    machine_busy: float
    own: float  # the benchmark process itself (user + system)
    by_pid: dict[int, tuple[str, float]]

    @classmethod
    def take(cls) -> CpuSnapshot:
        by_pid: dict[int, tuple[str, float]] = {}
        for pid, role in descendants(os.getpid()).items():
            try:
                by_pid[pid] = (role, parse_stat_cpu(Path(f"/proc/{pid}/stat").read_text()))
            except (OSError, ValueError):
                continue
        times = os.times()
        return cls(
            at=time.monotonic(),
            machine_busy=machine_busy_seconds(),
            own=times.user + times.system,
            by_pid=by_pid,
        )


def cpu_by_role(
    before: CpuSnapshot, after: CpuSnapshot, *, extra: dict[str, float] | None = None
) -> dict[str, float]:
    """CPU seconds per role between two snapshots: processes alive at the end, counted from
    zero if they started in between; `extra` adds what exited processes reported themselves."""
    out: dict[str, float] = {"bench (harness)": after.own - before.own}
    for pid, (role, cpu) in after.by_pid.items():
        start = before.by_pid.get(pid, (role, 0.0))[1]
        out[role] = out.get(role, 0.0) + max(0.0, cpu - start)
    for role, cpu in (extra or {}).items():
        out[role] = out.get(role, 0.0) + cpu
    return out


def sample(pid: int) -> ProcSample:
    stat = Path(f"/proc/{pid}/stat").read_text()
    status = Path(f"/proc/{pid}/status").read_text()
    return ProcSample(
        cpu_seconds=parse_stat_cpu(stat),
        rss_bytes=parse_status_kib(status, "VmRSS"),
        peak_rss_bytes=parse_status_kib(status, "VmHWM"),
    )


class Child:
    """A child process with its log file; ended by its own PID only."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        capture_stdout: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            # Only children that announce their port on stdout get a pipe; nobody reads it
            # afterwards, so the others write to the log file and can never block on it.
            stdout=subprocess.PIPE if capture_stdout else self._log,
            stderr=self._log,
            start_new_session=True,  # a Ctrl-C for the bench is handled by the bench
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def first_stdout_json(self, timeout: float) -> dict[str, Any]:
        """The first JSON line the child prints (its URLs or port)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        buffer = b""
        while time.monotonic() < deadline:
            chunk = self.proc.stdout.read()
            if chunk:
                buffer += chunk
                if b"\n" in buffer:
                    line = buffer.split(b"\n", 1)[0]
                    parsed: dict[str, Any] = json.loads(line)
                    return parsed
            elif not self.alive():
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not start; see {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> int | None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


def python_child(
    name: str,
    module: str,
    *args: str,
    env: Mapping[str, str],
    log_path: Path,
    capture_stdout: bool = False,
) -> Child:
    return Child(
        name,
        [sys.executable, "-m", module, *args],
        env=env,
        log_path=log_path,
        capture_stdout=capture_stdout,
    )


def wait_http_ok(url: str, *, timeout: float, child: Child | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if child is not None and not child.alive():
                raise RuntimeError(f"{child.name} exited:\n{child.tail()}")
            try:
                response = http.get(url)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = type(exc).__name__
            time.sleep(0.2)
    tail = child.tail() if child is not None else ""
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s ({last})\n{tail}")
