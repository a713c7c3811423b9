"""A resizable bound on concurrent Director requests, with concurrency statistics.

Requests beyond the limit wait (FIFO as asyncio.Condition wakes them) for a free
slot, so throughput is bounded by limit / service time. `in_flight` counts every
Director request inside the simulator (waiting or served), `active` only those
holding a slot; both peaks are kept until `reset_peaks`. The async methods run on
the simulator's event loop; `stats()` may be read from any thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import BaseModel

__all__ = ["CapacityGate", "ConcurrencyStats"]


class ConcurrencyStats(BaseModel):
    limit: int | None
    in_flight: int
    active: int
    peak_in_flight: int
    peak_active: int
    waited: int  # requests that had to wait for a slot


class CapacityGate:
    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._condition = asyncio.Condition()
        self._in_flight = 0
        self._active = 0
        self._peak_in_flight = 0
        self._peak_active = 0
        self._waited = 0

    def _has_room(self) -> bool:
        return self._limit is None or self._active < self._limit

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        try:
            async with self._condition:
                if not self._has_room():
                    self._waited += 1
                    await self._condition.wait_for(self._has_room)
                self._active += 1
                self._peak_active = max(self._peak_active, self._active)
            try:
                yield
            finally:
                # Free the slot before taking the lock, so a cancellation while
                # waiting for the lock cannot leak it.
                self._active -= 1
                async with self._condition:
                    self._condition.notify()
        finally:
            self._in_flight -= 1

    async def set_limit(self, limit: int | None) -> None:
        async with self._condition:
            self._limit = limit
            self._condition.notify_all()

    def reset_peaks(self) -> None:
        self._peak_in_flight = self._in_flight
        self._peak_active = self._active
        self._waited = 0

    def stats(self) -> ConcurrencyStats:
        return ConcurrencyStats(
            limit=self._limit,
            in_flight=self._in_flight,
            active=self._active,
            peak_in_flight=self._peak_in_flight,
            peak_active=self._peak_active,
            waited=self._waited,
        )
