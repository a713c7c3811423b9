"""The concurrency limit on Director calls: a counting semaphore whose waiters are served by
(priority, arrival), so the second call of a request that already holds Director's attention
(the token after a registration) goes before first calls, and admitted requests finish in the
time the capacity schedule promised.

Holds: a released slot is handed straight to the next waiter, so `free > 0` implies nobody
waits; at most `capacity` slots are taken; `acquire` answers when the slot became the caller's:
for a waiter, the moment it was handed over, before the event loop got round to resuming the
waiter (the slot is held meanwhile), which is where the schedule's measure of a call starts.
A waiter can be sent away (`refuse`) with the error its `acquire` then raises: its place goes to
those behind it and it holds no slot. No I/O: asyncio only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

FIRST_CALL = 1
FOLLOW_UP = 0  # served first: the request has already spent Director's time

Tag = TypeVar("Tag")


@dataclass(eq=False)
class Waiter(Generic[Tag]):
    """A call waiting for a slot: what its caller tagged it with, and since when it waits."""

    tag: Tag | None
    since: float
    future: asyncio.Future[float]


class PrioritySlots(Generic[Tag]):
    """A counting semaphore whose waiters are served by (priority, arrival)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._free = capacity
        self._clock = clock
        self._waiters: list[tuple[int, int, Waiter[Tag]]] = []
        self._seq = itertools.count()
        self.waiting = 0

    async def acquire(self, priority: int, wait_seconds: float, tag: Tag | None = None) -> float:
        if self._free > 0:
            self._free -= 1
            return self._clock()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiter = Waiter(tag, self._clock(), future)
        heapq.heappush(self._waiters, (priority, next(self._seq), waiter))
        self.waiting += 1
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait_seconds)
        except BaseException:
            if not future.done():
                future.cancel()
                self.waiting -= 1
            elif not future.cancelled() and future.exception() is None:
                self.release()  # granted just as we gave up: pass the slot on
            raise

    @property
    def taken(self) -> int:
        return self.capacity - self._free

    def queue(self, *, ordered: bool = True) -> list[Waiter[Tag]]:
        """The calls waiting now, in the order they will be served (`ordered`), or in any order
        (no sort)."""
        entries = sorted(self._waiters) if ordered else self._waiters
        return [w for _, _, w in entries if not w.future.done()]

    def refuse(self, waiter: Waiter[Tag], error: BaseException) -> None:
        """Sends `waiter` away: its `acquire` raises `error`."""
        if not waiter.future.done():
            waiter.future.set_exception(error)
            self.waiting -= 1

    def release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.future.done():
                self.waiting -= 1
                waiter.future.set_result(self._clock())  # the slot moves to the waiter as it is
                return
        self._free += 1
