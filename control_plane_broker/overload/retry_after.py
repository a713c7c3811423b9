"""Retry-After values: a base delay plus jitter, so refused callers do not return together."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

Jitter = Callable[[], float]  # returns a number in [0, 1)


def retry_after_seconds(base: float, *, jitter_max: float, rand: Jitter = random.random) -> int:
    """Whole seconds (the header's unit), at least 1, base rounded up plus up to `jitter_max`."""
    return max(1, math.ceil(max(0.0, base) + rand() * max(0.0, jitter_max)))
