"""THE retry policy of the agent, as data, and the one function that turns it into a delay.

Always holds: `next_delay` is pure (randomness comes in as `rng`) and never negative. Without a
hint from the server (a transport error, an answer without `Retry-After`) the wait grows
exponentially up to the cap, with "full" jitter (uniform in [0, step]) so that a herd of agents
that failed together spreads out instead of retrying in lock-step. With `Retry-After` the
server has said when: the agent comes back then, plus a little jitter (at most a tenth of the
wait, at least `base`, never more than its own step), also above the cap — coming back sooner
only earns another 503, and coming back much later (as an exponential backoff grown over a long
outage would) leaves the capacity the broker booked for it unused.

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

    With `retry_after` (seconds the server asked for), the wait is that plus a small jitter
    window, whatever the attempt: the server spreads its callers, our backoff does not outgrow
    its answer.
    """
    capped = step(policy, attempt)
    source: RandomSource = rng if rng is not None else random.SystemRandom()
    if retry_after is not None and retry_after > 0:
        if policy.jitter is Jitter.NONE:
            return retry_after
        window = min(capped, max(policy.base, retry_after / 10))
        return retry_after + source.uniform(0.0, window)
    delay = source.uniform(0.0, capped) if policy.jitter is Jitter.FULL else capped
    return max(delay, 0.0)


def jittered(seconds: float, *, rng: RandomSource | None = None, spread: float = 0.2) -> float:
    """`seconds` ± `spread` (a fraction), uniformly: for periodic work (heartbeats, re-checks)
    so that agents started together do not stay in step."""
    source: RandomSource = rng if rng is not None else random.SystemRandom()
    return max(source.uniform(seconds * (1 - spread), seconds * (1 + spread)), 0.0)


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
