"""An event loop on virtual time, for unit tests of code that waits by the loop's timers.

Nothing sleeps: when no callback is ready, the loop's clock moves to the next timer at once, so
`asyncio.sleep`, `call_later` and `wait_for` timeouts are exact and free. Only for code that
does no I/O (an `httpx.MockTransport` is fine): the selector sees no file descriptor.

    loop = VirtualLoop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()

or, the same, `run_virtually(scenario())`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.BaseSelector):
    """Selects nothing and moves the loop's clock to the next timer instead of waiting."""

    def __init__(self, clock: list[float]) -> None:
        self._clock = clock
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("nothing scheduled: the model would wait forever")
        self._clock[0] += max(timeout, 0.0)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = [0.0]
        super().__init__(_Selector(self.now))

    def time(self) -> float:
        return self.now[0]


def run_virtually(main: Coroutine[Any, Any, T]) -> T:
    """Runs `main` to its end on a fresh `VirtualLoop`."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
