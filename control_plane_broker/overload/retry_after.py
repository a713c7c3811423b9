"""The one place a wait becomes a `Retry-After` value. Every stage that refuses computes only how
long the caller should wait; this module turns that wait into the header's whole seconds.

Two rules, and which one applies is the refusal's, not the stage's:

- `header_seconds`: the wait rounded up to whole seconds, at least 1, plus up to `jitter_max`
  random seconds where a herd receives the refusal at once (an error's `spread`), so refused
  callers do not come back together. `api/problems` applies it to every 429 and 503.
- `reservation_wait`: a deferred request's reservation of Director's capacity starts `wait`
  seconds from now. Agents add their own jitter to `Retry-After`, so the answer is aimed early
  enough that the agent arrives a quarter of `max_wait` before the reservation starts, but not
  more than `max_wait` before it (it would only be deferred again). The capacity schedule has
  already spread the herd, so no jitter is added (the error's `spread` is False).

Holds: pure (randomness is an argument); the header is whole seconds and at least 1; for the
same wait the same value as before Retry-After had one home (tests/unit/broker/test_retry_after.py).
Why: docs/design/0006-aim-reservations-early.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

Jitter = Callable[[], float]  # returns a number in [0, 1)

# What an agent adds to Retry-After (agent/retry_policy.py): up to this share of it, at least
# a second.
CLIENT_JITTER_SHARE = 0.1
CLIENT_MIN_JITTER = 1.0
LEAD_SHARE_OF_MAX_WAIT = 0.25  # how far before its reservation an agent is aimed to arrive


def header_seconds(wait: float, *, jitter_max: float, rand: Jitter = random.random) -> int:
    """Whole seconds (the header's unit), at least 1: `wait` rounded up plus up to `jitter_max`."""
    return max(1, math.ceil(max(0.0, wait) + rand() * max(0.0, jitter_max)))


def reservation_wait(wait: float, *, max_wait: float) -> float:
    """Whole seconds to answer for a reservation that starts `wait` seconds ahead: a time from
    which an agent arrives a quarter of `max_wait` before the start despite its jitter, but not
    more than `max_wait` before it. At least one second."""
    lead = LEAD_SHARE_OF_MAX_WAIT * max(max_wait, 0.0)
    latest = min(wait / (1 + CLIENT_JITTER_SHARE), wait - CLIENT_MIN_JITTER) - lead
    earliest = wait - max(max_wait, 0.0)
    # (the epsilon: 33 / 1.1 is 29.999... in binary, and 30 + its tenth is still on time)
    return float(max(1, math.floor(latest + 1e-9), math.ceil(earliest - 1e-9)))
