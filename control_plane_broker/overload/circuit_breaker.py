"""The circuit breaker in front of Director, as a pure state machine: while Director is down,
callers are refused at once instead of each spending a call that fails.

closed --(threshold consecutive retryable failures)--> open
open --(open_seconds elapsed, next caller)--> half-open (exactly one probe admitted)
half-open --success--> closed;  half-open --failure--> open (timer restarts)

Holds: pure (the clock is passed in, nothing here sleeps); while open, `admit` refuses every
call; in half-open at most one call is in flight. Permanent failures are not outages: they count
as successes for the breaker. Director's internal errors (code 10) name no cause: one counts as
a failure only when it is about a runtime that has not failed so in the current run of failures
(`record_ambiguous`), so one broken runtime asking again and again never opens the breaker,
while a database failing every runtime does (`director/classification.py` has the evidence).
Why: docs/design/0012-probe-verdict-within-a-second.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True)
class BreakerPolicy:
    failure_threshold: int
    open_seconds: float


@dataclass(frozen=True)
class Breaker:
    state: State = State.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    probe_in_flight: bool = False
    # The runtimes whose internal errors are counted in `failures`: at most the threshold.
    suspects: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Permit:
    """The breaker's answer to one call: may it go out, and if not, how long until one may."""

    allowed: bool
    retry_after: float = 0.0  # seconds until a call may be admitted, when refused


def admit(breaker: Breaker, policy: BreakerPolicy, now: float) -> tuple[Breaker, Permit]:
    """May a call go out now? Returns the new state and the answer."""
    if breaker.state is State.CLOSED:
        return breaker, Permit(allowed=True)
    if breaker.state is State.OPEN:
        remaining = breaker.opened_at + policy.open_seconds - now
        if remaining > 0:
            return breaker, Permit(allowed=False, retry_after=remaining)
        return replace(breaker, state=State.HALF_OPEN, probe_in_flight=True), Permit(True)
    # HALF_OPEN
    if breaker.probe_in_flight:
        # The probe decides; until then everybody else waits about one open period.
        return breaker, Permit(allowed=False, retry_after=policy.open_seconds)
    return replace(breaker, probe_in_flight=True), Permit(allowed=True)


def would_refuse(breaker: Breaker, policy: BreakerPolicy, now: float) -> bool:
    """Would `admit` refuse a call now? A question only: nothing changes, no probe is taken."""
    if breaker.state is State.OPEN:
        return breaker.opened_at + policy.open_seconds - now > 0
    return breaker.state is State.HALF_OPEN and breaker.probe_in_flight


def may_leave_queue(breaker: Breaker, *, probe: bool) -> bool:
    """May a call admitted earlier go out now that it has a concurrency slot?

    A probe goes out: it is the one call the half-open state waits for. Any other call
    goes out only while the breaker is still closed; one that opened while the call
    queued must not be undermined by the queue that built up during the outage.
    """
    return probe or breaker.state is State.CLOSED


# A probe's verdict is due within one call's time: callers refused while it is out are told to
# come back then, not after a whole open period (docs/design/0012-probe-verdict-within-a-second.md).
PROBE_VERDICT_SECONDS = 1.0


def seconds_until_probe(breaker: Breaker, policy: BreakerPolicy, now: float) -> float:
    """How long a refused caller should wait: the open period left, or, while the probe is out,
    until its verdict is likely in (a failed probe opens the breaker again, and the caller is
    then told the next open period)."""
    if breaker.state is State.OPEN:
        return max(breaker.opened_at + policy.open_seconds - now, 0.0)
    if breaker.state is State.HALF_OPEN and breaker.probe_in_flight:
        return min(policy.open_seconds, PROBE_VERDICT_SECONDS)
    return 0.0


def record_success(breaker: Breaker) -> Breaker:
    return Breaker()


def release_probe(breaker: Breaker) -> Breaker:
    """The probe ended without a verdict (cancelled): let the next caller probe."""
    return replace(breaker, probe_in_flight=False)


def record_ambiguous(breaker: Breaker, policy: BreakerPolicy, now: float, subject: str) -> Breaker:
    """Director's internal error for `subject`: a failure only the first time in this run."""
    if breaker.state is State.HALF_OPEN:
        return record_failure(breaker, policy, now)  # the probe failed, whatever the cause
    if subject in breaker.suspects:
        return breaker  # the same runtime failing again says nothing new about Director
    after = record_failure(breaker, policy, now)
    if after.state is State.OPEN:
        return replace(after, suspects=frozenset())  # the run is over: the breaker opened
    return replace(after, suspects=breaker.suspects | {subject})


def record_failure(breaker: Breaker, policy: BreakerPolicy, now: float) -> Breaker:
    """A retryable failure (transport, 5xx, 429, retryable GraphQL codes)."""
    if breaker.state is State.HALF_OPEN:
        return Breaker(state=State.OPEN, failures=breaker.failures + 1, opened_at=now)
    if breaker.state is State.OPEN:
        # A call admitted before the breaker opened failed late: keep the timer running.
        return replace(breaker, failures=breaker.failures + 1)
    failures = breaker.failures + 1
    if failures >= policy.failure_threshold:
        return Breaker(state=State.OPEN, failures=failures, opened_at=now)
    return replace(breaker, failures=failures)
