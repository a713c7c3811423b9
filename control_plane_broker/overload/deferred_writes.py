"""KCP writes that no answer waits for (a mapping's status after a token, Events) step aside while
requests wait for Director: the broker's CPU and the KCP API server go to feeding Director first.

Why: a new runtime costs four KCP writes, and only two of them (the claim and the recorded
Compass ID) stand between Director and the runtime's token; the status after the token and the
Event only tell an operator. In a cold start of 1,000 runtimes through the real Director, KCP
requests were a third of the broker's CPU samples (py-spy), and the broker and the KCP API server
saturated their core while Director's was a third idle (docs/benchmarks.md). Deferred, these
writes run when no call waits for Director and none of its capacity is booked ahead, and never
later than `max_delay` after they were asked for, so a landscape that stays busy still sees its
statuses within about that time.

Holds: every write asked for runs once; one worker runs them in the order asked, so two writes
of one mapping (a failure, then the token issued) land in that order; with `max_pending` queued
a write starts at once instead (the writes of an overload are never lost to the queue), and with
`max_started` of those running too it is refused (False: the caller logs what it drops); a
write's failure is logged by type and never stops the queue; `drain` at shutdown runs what is
left without waiting for quiet. No I/O of its own: asyncio only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[object]]  # what it returns is not read

MAX_DELAY_SECONDS = 30.0  # a write is due this long after it was asked for, busy or not
MAX_PENDING = 20_000  # a cold start of this many runtimes fits; each entry is a closure
MAX_STARTED = 1024  # writes started at once because the queue was full, at most
POLL_SECONDS = 0.25  # how often a held write looks again whether Director's queue emptied
DRAIN_CONCURRENCY = 8  # at shutdown: what is left is written a few at a time, within the grace


@dataclass(frozen=True)
class _Deferred:
    work: Work
    asked_at: float


def hold_for(*, asked_at: float, now: float, busy: bool, max_delay: float) -> float:
    """How long the oldest deferred write still waits: 0 when it may run now (nothing waits for
    Director, or it has waited `max_delay`), otherwise at most `POLL_SECONDS`."""
    if not busy:
        return 0.0
    left = asked_at + max_delay - now
    return 0.0 if left <= 0 else min(left, POLL_SECONDS)


class DeferredWrites:
    """A FIFO of writes that one worker (`run`, a supervised task) runs when `busy()` says nothing
    waits for Director, or once they have waited `max_delay`."""

    def __init__(
        self,
        *,
        busy: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_delay: float = MAX_DELAY_SECONDS,
        max_pending: int = MAX_PENDING,
        max_started: int = MAX_STARTED,
        on_depth: Callable[[int], None] | None = None,
    ) -> None:
        self._busy = busy
        self._clock = clock
        self._sleep = sleep
        self._max_delay = max_delay
        self._max_pending = max_pending
        self._max_started = max_started
        self._on_depth = on_depth
        self._queue: deque[_Deferred] = deque()
        self._running = 0  # taken from the queue by the worker, not written yet
        self._started: set[asyncio.Task[None]] = set()
        self._arrived = asyncio.Event()
        self._overflowing = False

    @property
    def pending(self) -> int:
        """Asked for and not written yet (queued, or being written by the worker)."""
        return len(self._queue) + self._running

    def defer(self, work: Work) -> bool:
        """Queues `work`, or starts it at once when the queue is full; False when that is full
        too (nothing was done: the caller says what it drops)."""
        if len(self._queue) < self._max_pending:
            self._overflowing = False
            self._queue.append(_Deferred(work, self._clock()))
            self._depth()
            self._arrived.set()
            return True
        if not self._overflowing and self._max_pending > 0:
            self._overflowing = True
            log.warning(
                "deferred KCP writes: queue full, further writes start at once",
                extra={"pending": len(self._queue)},
            )
        if len(self._started) >= self._max_started:
            return False
        task = asyncio.create_task(_run(work))
        self._started.add(task)
        task.add_done_callback(self._started.discard)
        return True

    async def run(self) -> None:
        """The worker: takes the oldest write when it may run, forever."""
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait = hold_for(
                asked_at=self._queue[0].asked_at,
                now=self._clock(),
                busy=self._busy(),
                max_delay=self._max_delay,
            )
            if wait > 0:
                await self._sleep(wait)
                continue
            item = self._queue.popleft()
            self._running = 1
            try:
                await _run(item.work)
            finally:
                self._running = 0
                self._depth()

    async def drain(self) -> None:
        """At shutdown (the worker stopped): runs every write still queued, a few at a time, and
        waits for those started at once."""
        if self._queue:
            log.info("writing deferred KCP writes before exit", extra={"pending": len(self._queue)})
        while self._queue:
            batch = [
                self._queue.popleft().work for _ in range(min(DRAIN_CONCURRENCY, len(self._queue)))
            ]
            self._depth()
            await asyncio.gather(*(_run(work) for work in batch))
        if self._started:
            await asyncio.gather(*list(self._started), return_exceptions=True)

    def _depth(self) -> None:
        if self._on_depth is not None:
            self._on_depth(self.pending)


async def _run(work: Work) -> None:
    try:
        await work()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # The writes queued here handle their own KCP errors; whatever escapes is a bug, and one
        # write's bug must not stop the writes behind it.
        log.error("deferred KCP write failed", extra={"error": type(exc).__name__})
