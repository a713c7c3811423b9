"""A request's reservation of Director's capacity, as a value, and the decision that makes one.

`decide` is the limiter's answer to a request of k Director calls, on plain data (the breaker,
the capacity schedule, the queue in front of Director, the clock's reading): admit it now (the
caller gets a `Reservation`), defer it (a reservation of capacity later, told as a wait), or
refuse it (the breaker is open: a reservation after the next probe, told as a wait). The
`DirectorLimiter` is its async shell: it reads the clock, raises the refusals and counts the
admitted requests' calls in its `ReservationLedger`.

A `Reservation` is passed explicitly to every Director call the request makes (and to the
registration that makes some of them): its calls are counted in the queue in front of Director
from the first one on and priced as the request's (`capacity_schedule`), and each call for a
waiting caller leaves only when its answer can be back before the reservation's `deadline`.

Holds: pure (no I/O, the clock is an argument); a deferred or refused request leaves a
reservation in the schedule under its key and is told when to come back; the wait told is aimed
early at the reservation (`retry_after.reservation_wait`) unless the schedule says otherwise
(`Deferred.aim_early`); an admitted request counts in the queue in front of Director (`ahead`)
from its first call's asking for a slot until it is finished, and is finished at most once.
Why: docs/design/0005-capacity-schedule-instead-of-a-queue.md,
docs/design/0010-queue-counted-from-first-call.md,
docs/design/0014-request-deadline-from-arrival.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import Admit, CapacitySchedule, Deferred
from control_plane_broker.overload.retry_after import reservation_wait


@dataclass
class SlotUse:
    """What a reservation's calls used of Director's slots so far (the ledger's record)."""

    calls: int = 0  # calls made, reserved or not
    slot_seconds: float = 0.0  # grant to answer, summed over those calls
    failed: bool = False
    finished: bool = False
    asked: bool = False  # its first call has asked for a slot


@dataclass(frozen=True, eq=False)
class Reservation:
    """A request's claim on Director's capacity: `calls` Director calls for the runtime `key`,
    whose caller stops waiting at `deadline` (the limiter's clock; None: no caller waits).
    `use` is the ledger's record of its calls, never set by the request."""

    key: str
    calls: int
    deadline: float | None = None
    use: SlotUse = field(default_factory=SlotUse, repr=False)

    @property
    def finished(self) -> bool:
        return self.use.finished


@dataclass(frozen=True)
class Defer:
    """Director's capacity is booked: a reservation waits for the request `retry_after` on."""

    retry_after: float


@dataclass(frozen=True)
class Refuse:
    """The breaker would refuse a call: a reservation after the next probe, `retry_after` on."""

    retry_after: float


Decision = Admit | Defer | Refuse


def told(verdict: Deferred, *, max_wait: float) -> float:
    """The wait a deferred caller is told: aimed early at its reservation, unless it was
    deferred because the queue is longer than promised (see `Deferred.aim_early`)."""
    return reservation_wait(verdict.wait, max_wait=max_wait) if verdict.aim_early else verdict.wait


def decide(
    schedule: CapacitySchedule,
    breaker: cb.Breaker,
    policy: cb.BreakerPolicy,
    *,
    key: str,
    calls: int,
    now: float,
    queued_calls: float,
    deadline: float | None = None,
) -> Decision:
    """Admit, defer or refuse a request of `calls` Director calls for `key` at `now`, with
    `queued_calls` waiting in front of Director. While the breaker would refuse a call, the
    request is refused without taking the probe, with a reservation after the probe rather than
    one moment for everybody (`CapacitySchedule.reserve`'s `not_before`). Otherwise it is
    admitted when its reservation starts within the schedule's `max_wait` and its calls end
    before `deadline`, and deferred with a reservation when not."""
    if cb.would_refuse(breaker, policy, now):
        probe_at = now + cb.seconds_until_probe(breaker, policy, now)
        verdict = schedule.reserve(
            key, calls=calls, now=now, queued_calls=queued_calls, not_before=probe_at
        )
        if isinstance(verdict, Deferred):
            return Refuse(retry_after=told(verdict, max_wait=schedule.max_wait))
        return Refuse(retry_after=probe_at - now)
    verdict = schedule.reserve(
        key, calls=calls, now=now, queued_calls=queued_calls, deadline=deadline
    )
    if isinstance(verdict, Deferred):
        return Defer(retry_after=told(verdict, max_wait=schedule.max_wait))
    return Admit()


@dataclass
class ReservationLedger:
    """The reservations not finished, and what a finished one cost per call it reserved: the
    schedule's measure of a call (`capacity_schedule`).

    In the queue in front of Director (`ahead`) a reservation counts from its first call's
    asking for a slot until it is finished, with what it reserved less what its calls have held
    so far, in reserved calls at the schedule's price: `started` - `spent_seconds` / price,
    summed over those reservations (one that held more than it reserved makes up for one that
    held less)."""

    outstanding: int = 0  # reserved calls of reservations not finished
    started: int = 0  # reserved calls of reservations that asked for a slot, not finished
    spent_seconds: float = 0.0  # slot seconds those reservations' answered calls held

    def open(self, calls: int, *, key: str = "", deadline: float | None = None) -> Reservation:
        reservation = Reservation(key=key, calls=max(calls, 1), deadline=deadline)
        self.outstanding += reservation.calls
        return reservation

    def asking(self, reservation: Reservation) -> None:
        """A call of `reservation` asks for a slot: from now on it is in the queue."""
        use = reservation.use
        if use.asked or use.finished:
            return
        use.asked = True
        self.started += reservation.calls

    def spent(self, reservation: Reservation, seconds: float, *, ok: bool) -> None:
        """One call of `reservation` held its slot `seconds`, from grant to answer."""
        held = max(seconds, 0.0)
        use = reservation.use
        use.calls += 1
        use.slot_seconds += held
        use.failed |= not ok
        if use.asked and not use.finished:
            self.spent_seconds += held

    def ahead(self, price: float) -> float:
        """Reserved calls still to be served of the reservations in the queue, `price` the slot
        seconds of a reserved call (the schedule's latency)."""
        if self.started <= 0:
            return 0.0
        return max(0.0, self.started - self.spent_seconds / max(price, 1e-9))

    def finish(self, reservation: Reservation) -> float | None:
        """The request is over (answered or given up): slot seconds per reserved call, the
        schedule's sample; None when it tells nothing about a call's cost (no call made, one
        failed: a failing Director's timeouts are no measure) or it was finished before."""
        use = reservation.use
        if use.finished:
            return None
        use.finished = True
        self.outstanding -= reservation.calls
        if use.asked:
            self.started -= reservation.calls
            self.spent_seconds -= use.slot_seconds
            if self.started <= 0:
                self.started, self.spent_seconds = 0, 0.0  # no rounding left behind
        if use.calls == 0 or use.failed:
            return None
        # Per reserved call, its look-ups included; one that ended before making every call it
        # reserved (its token held back, or sent away) is priced by the calls it made, or the
        # estimate would fall just when Director is slow enough to hold calls back.
        return use.slot_seconds / min(use.calls, reservation.calls)
