"""Director's capacity schedule: a deferred request gets a reservation of Director's capacity
and is told when to come back, instead of waiting in a queue that collapses.

The broker has `capacity` slots for Director calls, and a request of k calls holds them for about
k·`latency` seconds in all. A request reserves k·latency/capacity seconds of that capacity right
after everything reserved before it. When its reservation starts within `max_wait` it is
admitted and queues for a slot; otherwise it is deferred: answered 503 `capacity-booked` with
the time until its reservation starts (`overload/retry_after` aims the header early), and the
reservation is kept under the runtime's key. When the agent comes back then, its capacity is
still reserved, so it is admitted instead of reserving again. After an outage or a restart the
fleet thus arrives spread over exactly the time Director needs.

Refinements, each from a measurement (the decision records below):

- The rate: whether a request is admitted is judged at the moving average of a call's cost;
  what any request reserves, and where a deferred reservation starts, at the fastest of the
  recent calls (`seconds_per_call_ahead`). A reservation placed too late leaves Director idle
  until its agent is back; one placed too early costs only the agent's visit.
- The shift: reservations are placed with the latency known at the time. When Director serves
  slower than that, the first reservation that comes back to a queue longer than promised moves
  itself and every later one back by what the queue is late (`shift`), instead of each overdue
  agent being sent away for a second and asking again. A request deferred so is told when the
  queue will be back within the promise, not aimed early (`Deferred.aim_early`).
- The place kept: an admitted request that the slots cannot serve in time leaves the queue
  (`DirectorLimiter`) with a reservation where its calls would have been served, after the
  calls that stay and before the reservations made since (`hold_place`): placed after the last,
  it left Director idle in between.
- The cost of a call (`latency`) is the request's whole use of the slots, per call it reserved,
  as the broker experiences it: from each slot's grant to the answer parsed, summed over every
  call the request makes, divided by the calls it reserved, or by those it made when it ended
  before making them all (`reservations.ReservationLedger.finish`).
- The queue in front (`queued_calls`, from the caller) is counted in the same unit: what
  admitted requests reserved and their calls have not held yet, from the moment a request's
  first call asks for a slot to its end (`reservations.ReservationLedger.ahead`), plus calls
  that belong to no request. Before its first call a request is in the broker's own work (its
  mapping written to KCP) and counts only in the reservations (`reserved_until`).
- The deadline: a new request is admitted only when its wait and its calls end before its
  caller stops waiting, counted from its arrival in the broker, so the time it spent in front
  (the first-contact limit, the identity check) counts. The broker's own time after its
  reservation (its KCP writes) is not estimated: the call whose answer the caller waits for
  (the token) leaves only when its answer can be back in time (`DirectorLimiter.call`,
  docs/overload.md).

Holds: pure (the clock is an argument); no request waits longer than `max_wait` for its
reservation by the estimate, also one that comes back while the queue in front of Director is
longer than the schedule expected; the order of reservations survives a shift; a key holds at
most one reservation; a reservation expires `reservation_grace` after its start and is gone at
the next `reserve` or reading of the gauges, whatever the order the reservations were made in,
so an agent that never comes back is neither waited for nor counted, and the shift returns to 0
once no reservation is left; while Director is down a reservation keeps its place until it
starts; memory is bounded by the reservations not yet expired.
Why: docs/design/0005-capacity-schedule-instead-of-a-queue.md,
docs/design/0007-reserve-at-the-fastest-recent-call.md, docs/design/0008-shift-reservations.md,
docs/design/0009-price-a-call-by-slot-time.md, docs/design/0010-queue-counted-from-first-call.md,
docs/design/0014-request-deadline-from-arrival.md,
docs/design/0015-keep-the-queue-to-what-director-serves.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DirectorLoad:
    """What an operator watches to see whether Director or the broker is the limit."""

    in_flight: int  # calls holding a slot
    waiting: int  # calls admitted and waiting for a slot
    call_seconds: float  # the schedule's estimate of one call (slot held)
    reserved_ahead_seconds: float  # how far ahead Director's capacity is reserved
    reservations: int  # deferred requests holding a reservation
    shift_seconds: float  # how far the reservations moved back because Director fell behind
    slot_timeouts: int  # calls refused after waiting twice the queue timeout for a slot
    late_calls: int  # calls for a waiting caller held back: their answer would come too late


@dataclass(frozen=True)
class Admit:
    """The request may queue for Director's slots now."""


@dataclass(frozen=True)
class Deferred:
    wait: float  # seconds until the reservation starts
    # Whether the caller is told a time before the start (`retry_after.reservation_wait`), so
    # that it is in the queue when its turn comes. Not when it is deferred because the queue is
    # longer than promised: sent back early, it would find the queue as long and be deferred
    # again (the shift below).
    aim_early: bool = True


Verdict = Admit | Deferred


@dataclass
class _Reservation:
    start: float  # when the reserved capacity starts, before the schedule's `shift`
    expires: float  # likewise
    seq: int  # tells this reservation's entry in `CapacitySchedule._expiry` from stale ones


@dataclass
class CapacitySchedule:
    capacity: int
    max_wait: float
    # slot seconds per reserved call (see above): a first guess, replaced by measurements
    latency: float = 0.1
    reservation_grace: float = 60.0  # how late after its start a reservation is still honoured
    smoothing: float = 0.2  # weight of a new latency measurement (EWMA)
    max_latency: float = 30.0  # a hung call must not push reservations into the next hour
    reserved_until: float = 0.0
    shift: float = 0.0  # added to every reservation's start: how late Director is against them
    recent_calls: int = 32  # the fastest of this many recent calls spaces reservations far ahead
    _reservations: dict[str, _Reservation] = field(default_factory=dict)
    # The reservations by expiry, soonest first, for `expire`. Not the order they were made in:
    # a request sent out of the queue keeps its place before reservations made after it was
    # admitted (`hold_place`). Entries of reservations dropped or replaced since are skipped
    # when they come up, and the heap is rebuilt when they outnumber the live ones.
    _expiry: list[tuple[float, int, str]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _recent: deque[float] = field(default_factory=deque)

    def seconds_per_call(self) -> float:
        return self.latency / max(self.capacity, 1)

    def seconds_per_call_ahead(self) -> float:
        """The spacing of reservations far ahead: the fastest recent call, never slower than
        the average."""
        fastest = min(self._recent, default=self.latency)
        return min(fastest, self.latency) / max(self.capacity, 1)

    def slowest_recent_call(self) -> float:
        """The slowest of the recent calls, never faster than the average: what a call is
        priced at when the question is whether it surely ends in time."""
        return max(max(self._recent, default=self.latency), self.latency)

    def reserve(
        self,
        key: str,
        *,
        calls: int,
        now: float,
        queued_calls: float = 0,
        not_before: float | None = None,
        deadline: float | None = None,
    ) -> Verdict:
        """Admit a request of `calls` Director calls for `key` now, or reserve capacity for it
        and tell it when to return.

        `queued_calls` is what really waits for a slot at this moment: the schedule never
        believes Director to be freer than the queue in front of it shows. `not_before` is set
        while Director is down (the breaker is open): nobody is admitted, everybody gets a
        reservation after the next probe, so that when Director is back the fleet is already
        spread over the time it needs, instead of returning at once or after its backoff has
        grown long. `deadline`: when the request's caller stops waiting (its arrival in the
        broker plus the request deadline); a new request is admitted only when its wait and its
        calls end before then, so the time it already spent in the broker counts too. A request
        coming back at its reservation is not held to it: its wait is what was promised, and
        its calls are checked as they leave (`DirectorLimiter.call`)."""
        self.expire(now)
        reservation = self._reservations.get(key)
        if reservation is not None:
            start = reservation.start + self.shift
            if now > reservation.expires + self.shift:
                self._drop(key)
            elif start - now > self.max_wait or (not_before is not None and start > now):
                # Not started yet (or Director is still down and the start still ahead): the
                # same reservation again, nothing reserved twice, its place in the fleet kept.
                return Deferred(wait=start - now)
            else:
                behind = queued_calls * self.seconds_per_call() - self.max_wait
                if not_before is None and behind > 0:
                    # Director is behind the schedule (its latency grew after the reservations
                    # were placed, or another replica shares it): admitted now, it would wait
                    # longer than promised, perhaps past the agent's timeout. It and every later
                    # reservation move back by what the queue is late; places are kept.
                    late = now + behind - start
                    if late > 0:
                        self.shift += late
                        self.reserved_until += late
                    return Deferred(wait=reservation.start + self.shift - now, aim_early=False)
                self._drop(key)  # its capacity was reserved when it was deferred
                if not_before is None:
                    return Admit()
        # Whether it may queue now is judged at the average (the queue must not outlast
        # `max_wait`); where its reservation ends, which is where the next deferred one starts,
        # at the spacing ahead (see above), admitted or not.
        spacing = self.seconds_per_call_ahead()
        start = max(self.reserved_until, now + queued_calls * spacing)
        if not_before is None and self._in_time(now, queued_calls, calls, deadline):
            self.reserved_until = start + calls * spacing
            return Admit()
        if not_before is not None:
            start = max(start, not_before)
        self.reserved_until = start + calls * spacing
        self._put(key, start)
        return Deferred(wait=start - now)

    def hold_place(self, key: str, *, calls: int, now: float, queued_calls: float) -> Deferred:
        """A reservation for an admitted request of `calls` calls sent out of the queue in front
        of Director (it could not be served in time): it starts where the `queued_calls` that
        stay in front of it end, at the spacing of every reservation. Its calls were in that
        queue when the reservations made since were placed, so its place is before theirs, not
        after the last: placed after the last, it left a gap in which Director was idle while
        the agents waited for their turn (issue 35)."""
        spacing = self.seconds_per_call_ahead()
        start = now + max(queued_calls, 0.0) * spacing
        self.reserved_until = max(self.reserved_until, start + calls * spacing)
        self._put(key, start)
        return Deferred(wait=start - now)

    def _put(self, key: str, start: float) -> None:
        """`key`'s reservation from `start` (shift included), in place of any it held."""
        reservation = _Reservation(
            start=start - self.shift,
            expires=start + self.reservation_grace - self.shift,
            seq=next(self._seq),
        )
        self._reservations[key] = reservation
        heapq.heappush(self._expiry, (reservation.expires, reservation.seq, key))
        if len(self._expiry) > 2 * len(self._reservations) + 64:
            self._expiry = [(r.expires, r.seq, k) for k, r in self._reservations.items()]
            heapq.heapify(self._expiry)

    def _in_time(self, now: float, queued_calls: float, calls: int, deadline: float | None) -> bool:
        wait = max(self.reserved_until, now + queued_calls * self.seconds_per_call()) - now
        if wait > self.max_wait:
            return False
        return deadline is None or now + wait + calls * self.latency <= deadline

    def _drop(self, key: str) -> None:
        self._reservations.pop(key, None)
        if not self._reservations:
            self.shift = 0.0  # no reservation left to keep in order: the next herd starts afresh

    def observe(self, seconds: float) -> None:
        """A reserved call cost `seconds` of slot time (`ReservationLedger.finish`; a call outside
        any request, its own): the estimate follows what really happens."""
        sample = min(max(seconds, 0.0), self.max_latency)
        self.latency += self.smoothing * (sample - self.latency)
        self._recent.append(sample)
        if len(self._recent) > self.recent_calls:
            self._recent.popleft()

    def reservations(self) -> int:
        return len(self._reservations)

    def expire(self, now: float) -> None:
        """Drops the reservations of agents that did not come back within the grace, soonest
        expiry first, up to the first one still valid (O(log n) per reservation dropped).
        Called on every `reserve` and before the gauges are read, so that the reservations and
        the shift an operator sees are those of agents that may still come, also when no
        request has arrived since."""
        while self._expiry:
            expires, seq, key = self._expiry[0]
            reservation = self._reservations.get(key)
            if reservation is not None and reservation.seq == seq:
                if now <= expires + self.shift:
                    return
                self._drop(key)
            heapq.heappop(self._expiry)
