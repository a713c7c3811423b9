"""Per-key token buckets: the per-runtime rate limits (token issues, connection reports, the
identity-failure budget), so one runtime asking too often delays only itself (429).

A bucket holds at most `burst` tokens and gains `per_second` tokens per second. `take`
either spends one token or says how long until one is available; `peek` only looks.

Holds: the bucket functions are pure over frozen state (the clock is passed in); `RateLimiter`
keeps at most `max_keys` buckets, and forgetting one never refuses a key it would have let in.
Why: docs/design/0013-bounded-per-runtime-state.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BucketPolicy:
    burst: int
    per_second: float


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: float


def take(bucket: Bucket | None, policy: BucketPolicy, now: float) -> tuple[Bucket, float | None]:
    """Returns the new bucket and None when a token was spent, else the seconds to wait."""
    if bucket is None:
        bucket = Bucket(tokens=float(policy.burst), updated_at=now)
    elapsed = max(0.0, now - bucket.updated_at)
    tokens = min(float(policy.burst), bucket.tokens + elapsed * policy.per_second)
    if tokens >= 1.0:
        return Bucket(tokens=tokens - 1.0, updated_at=now), None
    wait = (1.0 - tokens) / policy.per_second if policy.per_second > 0 else float("inf")
    return Bucket(tokens=tokens, updated_at=now), wait


def peek(bucket: Bucket | None, policy: BucketPolicy, now: float) -> float | None:
    """Like `take` without spending: None when a token is available, else the seconds to wait."""
    _, wait = take(bucket, policy, now)
    return wait


class RateLimiter:
    """The thin stateful shell: one bucket per key, at most `max_keys` of them. Over the bound,
    idle full buckets are forgotten first, then the least recently used (a forgotten bucket is
    a full one: forgetting errs towards letting a key through, never towards locking it out),
    down to nine tenths of the bound, so the sweep runs once per many new keys, not per key."""

    def __init__(self, policy: BucketPolicy, *, max_keys: int = 100_000) -> None:
        self._policy = policy
        self._buckets: dict[str, Bucket] = {}  # least recently used first
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, key: str, now: float) -> float | None:
        return peek(self._buckets.get(key), self._policy, now)

    def try_take(self, key: str, now: float) -> float | None:
        bucket, wait = take(self._buckets.pop(key, None), self._policy, now)
        self._buckets[key] = bucket
        if len(self._buckets) > self._max_keys:
            self._forget(now)
        return wait

    def _forget(self, now: float) -> None:
        for key, bucket in list(self._buckets.items()):
            _, wait = take(bucket, self._policy, now)
            refill = (self._policy.burst - bucket.tokens) / max(self._policy.per_second, 1e-9)
            if wait is None and now - bucket.updated_at >= refill:
                del self._buckets[key]
        excess = len(self._buckets) - self._max_keys * 9 // 10
        for key in list(self._buckets)[: max(excess, 0)]:
            del self._buckets[key]
