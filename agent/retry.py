"""THE retry policy of the agent, as data, and the one function that turns it into a delay.

Always holds: `next_delay` is pure (randomness comes in as `rng`), never negative, never
above the cap unless the server asked for longer with `Retry-After` — a server that says
"come back in 60 s" is obeyed even when our own cap is lower, because coming back sooner
only earns another 503. Jitter is "full" (uniform in [0, exponential step]) so that a herd of
agents that failed together spreads out instead of retrying in lock-step.

No Kubernetes or HTTP imports here: the benchmarks import this module to simulate agents.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Protocol


class Jitter(StrEnum):
    FULL = "full"  # uniform in [0, step]
    NONE = "none"  # exactly the step (tests, deterministic simulations)


class RandomSource(Protocol):
    def uniform(self, a: float, b: float, /) -> float: ...


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: Jitter = Jitter.FULL

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap <= 0 or self.factor < 1:
            raise ValueError("base and cap must be positive and factor at least 1")


DEFAULT_POLICY = RetryPolicy()


def step(policy: RetryPolicy, attempt: int) -> float:
    """The un-jittered delay after failed attempt number `attempt` (1-based), capped."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    # Exponent bounded so a long outage cannot overflow the float.
    exponent = min(attempt - 1, 64)
    return float(min(policy.cap, policy.base * policy.factor**exponent))


def next_delay(
    policy: RetryPolicy,
    attempt: int,
    *,
    retry_after: float | None = None,
    rng: RandomSource | None = None,
) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based).

    With `retry_after` (seconds the server asked for), the wait is at least that long; the
    jittered backoff still applies on top of a shorter server hint so a herd told "1 s" does
    not return together.
    """
    capped = step(policy, attempt)
    if policy.jitter is Jitter.FULL:
        source: RandomSource = rng if rng is not None else random.SystemRandom()
        delay = source.uniform(0.0, capped)
    else:
        delay = capped
    if retry_after is not None and retry_after > 0:
        return max(delay, retry_after)
    return max(delay, 0.0)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP date; None when absent or garbage."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max((when - current).total_seconds(), 0.0)
