"""The broker's own backoff: how long its loops wait after failures (watches, reconcile retries,
restarts of background tasks). Not overload protection: nothing here answers a caller.

Holds: pure; the delay doubles with each failure from `base` and never exceeds `cap`.
"""

from __future__ import annotations

from collections.abc import Callable

Delay = Callable[[int], float]  # failures so far (1-based) → seconds to wait


def backoff(failures: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Exponential backoff for the broker's own loops (watches, reconcile retries, restarts)."""
    return float(min(cap, base * 2 ** max(0, failures - 1)))


def watch_backoff(failures: int) -> float:
    return backoff(failures, base=0.5, cap=30.0)
