"""The concurrency limit on Director calls: a counting semaphore whose waiters are served by
(priority, arrival), so the second call of a request that already holds Director's attention
(the token after a registration) goes before first calls, and admitted requests finish in the
time the capacity schedule promised.

Holds: a released slot is handed straight to the next waiter, so `free > 0` implies nobody
waits; at most `capacity` slots are taken; `acquire` answers when the slot became the caller's:
for a waiter, the moment it was handed over, before the event loop got round to resuming the
waiter (the slot is held meanwhile), which is where the schedule's measure of a call starts.
No I/O: asyncio only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable

FIRST_CALL = 1
FOLLOW_UP = 0  # served first: the request has already spent Director's time


class PrioritySlots:
    """A counting semaphore whose waiters are served by (priority, arrival)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._free = capacity
        self._clock = clock
        self._waiters: list[tuple[int, int, asyncio.Future[float]]] = []
        self._seq = itertools.count()
        self.waiting = 0

    async def acquire(self, priority: int, wait_seconds: float) -> float:
        if self._free > 0:
            self._free -= 1
            return self._clock()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        self.waiting += 1
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait_seconds)
        except BaseException:
            if future.done() and not future.cancelled():
                self.release()  # granted just as we gave up: pass the slot on
            else:
                future.cancel()
                self.waiting -= 1
            raise

    @property
    def taken(self) -> int:
        return self.capacity - self._free

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                self.waiting -= 1
                future.set_result(self._clock())  # the slot moves to the waiter as it is
                return
        self._free += 1
