"""The first-contact limit's pure logic: runtimes the broker has not proven recently come in a
few at a time, and a newcomer who would wait too long is told at once when to come back.

A first contact is the costliest request (its identity check fetches keys or asks for a
TokenReview). The HTTP layer (`api/first_contact_middleware`) lets `capacity` of them into the
app at a time and parks the rest in arrival order; this module decides:

- how many a second get in: `capacity` / the moving average of how long a place is held;
- whether a newcomer waits in the shared queue: only when its place comes within `max_wait` at
  that rate; otherwise `refusal_wait` answers how long it should stay away: after the queue in
  front of it and after the waits announced before it, one place's worth apart, so the refused
  come back about as fast as they can be let in (announced, not reserved: a newcomer who comes
  back finds the queue as it is);
- one runtime ID's share (`own_queue_wait`): at most `share` of its requests hold or wait for
  the shared places; its others wait in a queue of their own, bounded by time the same way, so
  a runtime ID that floods the limit (or whose cluster stalls) delays only itself;
- which holds are measured: a hold that ended because a runtime's API server did not answer
  within its timeout says nothing about the rate. The identity adapter that saw the timeout
  raises `RuntimeApiSilent`; the use case tells the middleware so when the check is over
  (`identity.verifier.prove`), and the middleware leaves that hold out of its average.

Holds: pure, no I/O (the clock is an argument); no announced wait is longer than
`longest_wait` (the agent's longest backoff); by the measured rate no request waits in the
shared queue longer than `max_wait`.
Why: docs/design/0001-first-contacts-a-few-at-a-time.md,
docs/design/0002-first-contact-queue-bounded-by-time.md,
docs/design/0003-first-contact-share-per-runtime.md,
docs/design/0004-timed-out-holds-not-measured.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FirstContactLimit:
    """How fast first contacts are let in, and how long the refused should stay away. Pure."""

    capacity: int
    max_wait: float
    hold: float = 0.1  # seconds a place is held: a first guess, then measured
    smoothing: float = 0.1
    announced_until: float = 0.0  # where the last wait announced to a refused newcomer ends
    longest_wait: float = 300.0  # the agent's longest backoff: no wait announced beyond it

    def per_second(self) -> float:
        return self.capacity / max(self.hold, 1e-3)

    def refusal_wait(self, *, ahead: int, now: float) -> float | None:
        """None: the newcomer waits in the shared queue (its place comes within `max_wait`, with
        `ahead` waiting in front of it). Otherwise the seconds it should stay away: until after
        the queue in front of it and after every wait announced before, one place apart."""
        wait = ahead / self.per_second()
        if wait <= self.max_wait:
            return None
        until = min(max(self.announced_until, now + wait), now + self.longest_wait)
        self.announced_until = until + 1 / self.per_second()
        return until - now

    def own_queue_wait(self, *, present: int, share: int) -> float | None:
        """One runtime ID with `present` requests at the limit already, `share` of which may
        hold or wait for shared places: None when a new request may queue behind them, else the
        seconds it should stay away (its place in the runtime's own queue is beyond `max_wait`)."""
        ahead = present - share + 1
        wait = ahead * self.hold / share
        if ahead > 0 and wait > self.max_wait:
            return wait
        return None

    def observe(self, held_seconds: float) -> None:
        self.hold += self.smoothing * (max(held_seconds, 0.0) - self.hold)
