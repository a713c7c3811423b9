"""Progress lines on stderr while a benchmark runs (it takes minutes): at most one per period."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(
        self,
        *,
        stream: TextIO = sys.stderr,
        period: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._period = period
        self._clock = clock
        self._started = clock()
        self._last = -period

    def say(self, text: str) -> None:
        elapsed = self._clock() - self._started
        print(f"[bench {elapsed:6.0f}s] {text}", file=self._stream, flush=True)

    def tick(self, text: Callable[[], str]) -> None:
        """Prints `text()` if the last tick was at least one period ago."""
        now = self._clock()
        if now - self._last >= self._period:
            self._last = now
            self.say(text())
