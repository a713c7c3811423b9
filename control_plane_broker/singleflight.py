"""Single-flight: concurrent callers with the same key share one execution and its result.

Holds: for a key, at most one execution runs at a time in this process; callers that arrive
while it runs get its result (or its exception). A caller that is cancelled does not cancel the
shared execution for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Task[T]] = {}

    def in_flight(self, key: str) -> bool:
        return key in self._flights

    async def do(self, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        task = self._flights.get(key)
        if task is None:

            async def run() -> T:
                try:
                    return await fn()
                finally:
                    self._flights.pop(key, None)

            task = asyncio.ensure_future(run())
            self._flights[key] = task
        return await asyncio.shield(task)
