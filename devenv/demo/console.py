"""How the demo talks: numbered steps with elapsed time, `…` while waiting, `✓` when done,
`✗` when a step did not happen, and a plain-text table at the end.

Holds: output is line by line, with no cursor movement or colour, so it reads the same in a
terminal and in a CI log; every wait has a timeout and ends in `✓` or in `StepFailed`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")

_INDENT = " " * 10


class StepFailed(Exception):
    """A step did not happen in time (or a process it needed died); the message says which."""

    def __init__(self, message: str, *, logs: Sequence[Path] = ()) -> None:
        super().__init__(message)
        self.logs = list(logs)


class Story:
    def __init__(self, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self._out = out or sys.stdout
        self._clock = clock
        self._start = clock()
        self._number = 0

    def elapsed(self) -> float:
        return self._clock() - self._start

    def _print(self, text: str) -> None:
        print(text, file=self._out, flush=True)

    def _stamped(self, text: str) -> None:
        self._print(f"[{self.elapsed():6.1f}s] {text}")

    def say(self, text: str = "") -> None:
        self._print(text)

    def step(self, title: str) -> None:
        self._number += 1
        self._print("")
        self._stamped(f"{self._number}. {title}")

    def waiting(self, text: str) -> None:
        self._stamped(f"  … {text}")

    def done(self, text: str) -> None:
        self._stamped(f"  ✓ {text}")

    def failed(self, text: str) -> None:
        self._stamped(f"  ✗ {text}")

    def detail(self, text: str) -> None:
        self._print(f"{_INDENT}    {text}")

    def wait_for(
        self,
        what: str,
        check: Callable[[], T | None],
        *,
        timeout: float,
        guard: Callable[[], None] = lambda: None,
        logs: Sequence[Path] = (),
        interval: float = 0.2,
    ) -> T:
        """Polls `check` until it returns something truthy; `guard` raises when a process died.

        Prints `… what` first; returns the value without printing, so the caller's `✓` line
        can say what was found.
        """
        self.waiting(what)
        deadline = self._clock() + timeout
        while True:
            guard()
            value = check()
            if value:
                return value
            if self._clock() > deadline:
                raise StepFailed(f"{what}: did not happen within {timeout:.0f}s", logs=logs)
            time.sleep(interval)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces, with a rule under the header."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]
