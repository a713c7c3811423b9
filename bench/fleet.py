"""A simulated fleet: one agent per runtime, each asking the broker with the agent's own client.

Each simulated agent is the real `agent.broker_client.BrokerClient` (the agent's outcome
handling and its tenacity loop over THE retry policy `agent.retry_policy`: capped exponential
backoff with full jitter, `Retry-After` honoured, 30 s timeout), fed with a bearer token made
before the run (signed, or issued by a runtime API server): the fleet does no crypto while it runs.

The agents run in processes of their own (`python -m bench.fleet JOB`), never in the
benchmark's process, so their CPU is theirs and can be reported; each process reports its own
CPU when it ends. Agents share connection pools in groups of `POOL_GROUP`, one connection per
agent in each pool, so no agent waits for another and no pool grows so large that its
bookkeeping costs more than the requests. With several broker replicas, agent i asks replica
i mod R (a round-robin at the fleet side).

Protocol of the child: one JSON object per stdout line. `ready` once set up; it starts when a
line arrives on stdin (`go`); then `connected` / `refused` per agent as it happens, `attempts`
(totals so far) every second, and `done` with totals, `timed_out` and its CPU at the end.

Holds: an agent is "connected" when the broker answered 201; the run ends when every agent got
an answer that ends a pull (201 or a refusal) or at the deadline, whichever comes first; every
attempt's outcome is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import ssl
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent.broker_client import BrokerClient
from agent.outcomes import Issued, Outcome, Refused
from agent.retry_policy import DEFAULT_POLICY

AGENT_TIMEOUT = 30.0  # the agent's default AGENT_BROKER_TIMEOUT
POOL_GROUP = 50  # agents per shared connection pool
PROGRESS_PERIOD = 1.0


class StaticIdentity:
    """A projected ServiceAccount token that does not rotate during the run."""

    def __init__(self, token: str) -> None:
        self._authorization = f"Bearer {token}"

    async def authorization(self) -> str | None:
        return self._authorization


def outcome_label(outcome: Outcome) -> str:
    """A short, stable name for an attempt's outcome, for the tallies in the report."""
    if isinstance(outcome, Issued):
        return "201"
    if isinstance(outcome, Refused):
        return f"{outcome.status} {outcome.reason.rsplit(':', 1)[-1]}"
    if outcome.status is None:
        if outcome.reason.startswith("transport"):
            # The kind tells a timeout (the broker held the request too long) from a refused
            # or dropped connection (the listen backlog, a closed keep-alive connection).
            kind = outcome.reason.partition(":")[2].strip()
            return f"transport error {kind}" if kind else "transport error"
        return outcome.reason
    slug = outcome.reason.rsplit(":", 1)[-1] if outcome.reason.startswith("urn:") else ""
    return f"{outcome.status} {slug}".strip()


@dataclass(frozen=True)
class Agent:
    runtime_id: str
    token: str = field(repr=False)
    broker: int = 0  # index into the job's broker URLs


def assign_brokers(runtime_ids: Sequence[str], replicas: int) -> list[int]:
    """Round-robin at the fleet side: agent i asks replica i mod R."""
    if replicas < 1:
        raise ValueError("at least one broker replica")
    return [i % replicas for i in range(len(runtime_ids))]


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """`parts` interleaved slices (item i goes to part i mod parts), empty ones dropped."""
    return [list(items[p::parts]) for p in range(max(1, parts)) if items[p::parts]]


# --- the child process ------------------------------------------------------------------------


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def run_agents(
    brokers: Sequence[str], agents: Sequence[Agent], *, deadline_seconds: float
) -> None:
    attempts: Counter[str] = Counter()
    # One TLS context for every pool (the broker URL is plain HTTP here; httpx would load the
    # CA bundle once per pool otherwise).
    tls = ssl.create_default_context()
    pools = [
        httpx.AsyncHTTPTransport(
            verify=tls,
            limits=httpx.Limits(max_connections=POOL_GROUP, max_keepalive_connections=POOL_GROUP),
        )
        for _ in range(0, len(agents), POOL_GROUP)
    ]

    # Every client exists before "ready": the run measures requests, not the fleet's set-up.
    clients = [
        BrokerClient(
            base_url=brokers[agent.broker],
            identity=StaticIdentity(agent.token),
            policy=DEFAULT_POLICY,
            timeout=AGENT_TIMEOUT,
            transport=pools[index // POOL_GROUP],
            clock=lambda: datetime.now(UTC),
        )
        for index, agent in enumerate(agents)
    ]

    def seen(outcome: Outcome) -> None:
        attempts[outcome_label(outcome)] += 1

    async def one(client: BrokerClient, agent: Agent) -> None:
        # The client's own AsyncClient is not closed: that would close the shared pool.
        outcome = await client.pull(agent.runtime_id, on_attempt=seen)
        if isinstance(outcome, Issued):
            _emit({"event": "connected", "id": agent.runtime_id, "at": time.time()})
        else:
            _emit(
                {
                    "event": "refused",
                    "id": agent.runtime_id,
                    "reason": f"{outcome.status} {outcome.reason}",
                }
            )

    async def report_progress() -> None:
        while True:
            await asyncio.sleep(PROGRESS_PERIOD)
            _emit({"event": "attempts", "counts": dict(attempts)})

    _emit({"event": "ready", "agents": len(agents)})
    await asyncio.to_thread(sys.stdin.readline)  # "go"
    cpu_at_go = _own_cpu()
    tasks = [asyncio.create_task(one(c, a)) for c, a in zip(clients, agents, strict=True)]
    progress = asyncio.create_task(report_progress())
    timed_out = False
    try:
        _, pending = await asyncio.wait(tasks, timeout=deadline_seconds)
        timed_out = bool(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
        for pool in pools:
            await pool.aclose()
    failures = [
        repr(t.exception()) for t in tasks if not t.cancelled() and t.exception() is not None
    ]
    _emit(
        {
            "event": "done",
            "attempts": dict(attempts),
            "timed_out": timed_out,
            "finished_at": time.time(),
            "cpu_seconds": _own_cpu() - cpu_at_go,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "failures": failures[:5],
        }
    )


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m bench.fleet JOB_JSON", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    Path(args[0]).unlink()  # it holds bearer tokens: gone once read
    agents = [Agent(runtime_id=a[0], token=a[1], broker=int(a[2])) for a in job["agents"]]
    runner = run_agents(job["brokers"], agents, deadline_seconds=float(job["deadline_seconds"]))
    try:
        import uvloop  # type: ignore[import-not-found]  # noqa: PLC0415 (optional, faster)
    except ImportError:
        asyncio.run(runner)
    else:
        uvloop.run(runner)
    return 0


# --- the parent's side ------------------------------------------------------------------------


@dataclass
class FleetResult:
    started_at: float  # wall clock
    connected_at: dict[str, float] = field(default_factory=dict)  # runtime ID -> wall clock
    refused: dict[str, str] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    finished_at: float = 0.0
    timed_out: bool = False
    cpu_seconds: float = 0.0  # all fleet processes, from "go" to their end
    peak_rss_bytes: int = 0  # the largest fleet process
    processes: int = 0

    @property
    def connected(self) -> int:
        return len(self.connected_at)


class FleetProcesses:
    """Starts the fleet processes, says go to all at once, and collects their events."""

    def __init__(
        self,
        *,
        brokers: Sequence[str],
        agents: Sequence[Agent],
        processes: int,
        workdir: Path,
        env: dict[str, str],
        deadline_seconds: float,
    ) -> None:
        self._brokers = list(brokers)
        self._parts = split_evenly(list(agents), processes)
        self._workdir = workdir
        self._env = env
        self._deadline = deadline_seconds
        self._procs: list[asyncio.subprocess.Process] = []
        self._logs: list[Path] = []
        self._partial: list[Counter[str]] = []

    async def start(self) -> None:
        """Starts every process and returns once all are set up and waiting for go."""
        for index, part in enumerate(self._parts):
            job = self._workdir / f"fleet-{index}.json"
            job.touch(mode=0o600)
            job.write_text(
                json.dumps(
                    {
                        "brokers": self._brokers,
                        "agents": [[a.runtime_id, a.token, a.broker] for a in part],
                        "deadline_seconds": self._deadline,
                    }
                )
            )
            log = self._workdir / f"fleet-{index}.log"
            self._logs.append(log)
            with log.open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.fleet",
                    str(job),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    env=self._env,
                    limit=1 << 20,
                    start_new_session=True,
                )
            self._procs.append(proc)
            self._partial.append(Counter())
        for proc, log in zip(self._procs, self._logs, strict=True):
            event = await self._next_event(proc, within=120)
            if event is None or event.get("event") != "ready":
                raise RuntimeError(f"a fleet process did not start; see {log}")

    async def _next_event(
        self, proc: asyncio.subprocess.Process, within: float
    ) -> dict[str, Any] | None:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), within)
        except TimeoutError:
            return None
        if not line:
            return None
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    async def run(self, result: FleetResult, *, went: asyncio.Event | None = None) -> FleetResult:
        """Says go to every process (the run starts now: `result.started_at`, then `went` is
        set) and reads events until all are done."""
        result.started_at = time.time()
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in self._procs if p.stdin is not None))
        if went is not None:
            went.set()
        result.processes = len(self._procs)
        try:
            # Awaited here, not through wait_for: a run cancelled by SIGTERM or Ctrl-C then
            # leaves no gathering future whose cancellation nobody reads.
            async with asyncio.timeout(self._deadline + 120):
                await asyncio.gather(*(self._collect(i, result) for i in range(len(self._procs))))
        finally:
            await self.stop()
        if not result.finished_at:
            result.finished_at = time.time()
        return result

    async def _collect(self, index: int, result: FleetResult) -> None:
        proc = self._procs[index]
        while True:
            event = await self._next_event(proc, within=self._deadline + 120)
            if event is None:
                raise RuntimeError(f"a fleet process ended early; see {self._logs[index]}")
            kind = event.get("event")
            if kind == "connected":
                result.connected_at[str(event["id"])] = float(event["at"])
            elif kind == "refused":
                result.refused[str(event["id"])] = str(event["reason"])
            elif kind == "attempts":
                self._partial[index] = Counter(event["counts"])
                result.attempts = sum(self._partial, Counter())
            elif kind == "done":
                self._partial[index] = Counter(event["attempts"])
                result.attempts = sum(self._partial, Counter())
                result.timed_out = result.timed_out or bool(event["timed_out"])
                result.finished_at = max(result.finished_at, float(event["finished_at"]))
                result.cpu_seconds += float(event["cpu_seconds"])
                result.peak_rss_bytes = max(result.peak_rss_bytes, int(event["peak_rss_bytes"]))
                if event.get("failures"):
                    raise RuntimeError(f"simulated agents failed: {event['failures']}")
                return

    async def stop(self) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()


if __name__ == "__main__":
    sys.exit(main())
