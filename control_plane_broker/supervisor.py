"""Keeps the broker's long-running tasks alive and says whether the process is healthy.

Every background task (the Kyma and mapping watches, the Lease, reconcile workers, sweeps) runs
under `Supervisor.start`, which reports its start (`on_start`: its restart counter is at 0 from
then on, so the first restart is an increase the alert can see); whatever exception ends it, it
is logged, counted in `broker_task_restarts_total{task}` (`on_restart`) and started again after
a backoff that grows with failures in a row and starts over once the task has run for a while.
A task that is waiting to restart is "down"; readiness fails while a required task is down.

`LoopWatch` tells a wedged event loop: a ticker measures how late its timer fires; when the loop
was blocked longer than `wedge_seconds` recently, liveness fails, so the kubelet restarts a
process that stopped making progress instead of leaving it half-alive. Each tick's lateness is
also reported (`broker_event_loop_lag_seconds`): a loop busy enough to be late holds Director's
slots longer than Director needs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from control_plane_broker.backoff import backoff

log = logging.getLogger(__name__)

HEALTHY_RUN_SECONDS = 60.0  # a task that ran this long before failing starts its backoff over


@dataclass
class _Task:
    name: str
    required: bool
    task: asyncio.Task[None] | None = None
    down_since: float | None = None
    failures: int = 0


class Supervisor:
    def __init__(
        self,
        *,
        on_restart: Callable[[str], None],
        on_start: Callable[[str], None] | None = None,
        delay: Callable[[int], float] = lambda n: backoff(n, base=0.5, cap=30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_restart = on_restart
        self._on_start = on_start
        self._delay = delay
        self._clock = clock
        self._tasks: list[_Task] = []

    def start(
        self, name: str, run: Callable[[], Awaitable[None]], *, required: bool = True
    ) -> None:
        entry = _Task(name=name, required=required)
        if self._on_start is not None:
            self._on_start(name)
        entry.task = asyncio.create_task(self._keep(entry, run), name=name)
        self._tasks.append(entry)

    async def _keep(self, entry: _Task, run: Callable[[], Awaitable[None]]) -> None:
        while True:
            started = self._clock()
            entry.down_since = None
            try:
                await run()
                problem = "returned"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                problem = type(exc).__name__
                log.error(
                    "background task failed, restarting",
                    extra={"task": entry.name, "error": problem},
                    exc_info=True,
                )
            entry.down_since = self._clock()
            if entry.down_since - started >= HEALTHY_RUN_SECONDS:
                entry.failures = 0
            entry.failures += 1
            self._on_restart(entry.name)
            delay = self._delay(entry.failures)
            log.warning(
                "restarting background task",
                extra={"task": entry.name, "why": problem, "in_seconds": delay},
            )
            await asyncio.sleep(delay)

    def down(self) -> list[str]:
        """Required tasks that are not running right now."""
        return [t.name for t in self._tasks if t.required and t.down_since is not None]

    async def stop(self) -> None:
        tasks = [t.task for t in self._tasks if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class LoopWatch:
    def __init__(
        self,
        *,
        wedge_seconds: float,
        period: float = 0.5,
        memory_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        self._wedge = wedge_seconds
        self._on_lag = on_lag
        self._period = period
        self._memory = memory_seconds
        self._clock = clock
        self._last_tick = clock()
        self._wedged_at: float | None = None
        self.max_lag = 0.0

    async def run(self) -> None:
        while True:
            expected = self._clock() + self._period
            await asyncio.sleep(self._period)
            self.tick(expected)

    def tick(self, expected: float) -> None:
        now = self._clock()
        lag = now - expected
        self.max_lag = max(self.max_lag, lag)
        if self._on_lag is not None:
            self._on_lag(max(lag, 0.0))
        if lag >= self._wedge:
            self._wedged_at = now
            log.error("event loop was blocked", extra={"seconds": round(lag, 2)})
        self._last_tick = now

    def healthy(self) -> bool:
        now = self._clock()
        if now - self._last_tick >= self._wedge + self._period:
            return False  # the ticker itself stopped: nothing runs on time any more
        return self._wedged_at is None or now - self._wedged_at > self._memory
