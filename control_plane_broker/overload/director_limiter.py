"""Protects Director around every call: the circuit breaker, the capacity schedule and the
priority slots, combined. The request path asks it for a `Reservation` before Director's first
call (`reserve`: the breaker's cheap refusal, then the schedule's verdict, decided by
`reservations.decide`), passes that reservation to each of its Director calls, which all go
through `call`, and finishes it when it is answered (`finish`).

Holds: while the breaker is open no call leaves the process, also none that was already waiting
for a slot when it opened, and a caller learns that before it costs anything (`reserve`);
at most `max_concurrency` calls are in flight; a request gets a reservation only when it starts
within the queue timeout by the schedule's estimate (`reserve`), otherwise it is told when to come
back; the queue in front of a new request is counted as what admitted requests reserved
and their calls have not held yet, from the moment a request's first call asks for a slot (its
look-ups, its registration, its token; before that it is in the broker's own work and in the
schedule's reservations), plus the calls outside any request that wait and the follow-ups they
promised; each request's slot time, grant to answer over all its calls, per call it reserved, is
what the schedule measures; the second call of a request that already holds Director's
attention (the token after a registration) is served before first calls, so admitted requests
finish in the time promised; a request's first call that by the estimate will not get a slot
before its slot timeout, or whose request will not end by its deadline, is sent out of the queue
as soon as the estimate shows it, with a reservation where its calls would have been served
(`_shed`); a call that still waits longer than twice the queue timeout for a slot gets
`CompassUnavailable`; a call whose caller has hung up by the time it gets a slot does
not leave (`CallerGone`): after a restart thousands of agents time out while their requests
queue, and each of those calls would spend Director's time (and a one-time token) on nobody
while the agents that stayed wait; likewise a call for a caller still there leaves only when
its answer can reach the caller before the request's deadline (`reserve`): otherwise the caller
is told when to come back for it, with a reservation.

Also holds, for the operator: one WARNING per transition, never one per call: the breaker
opened (with the failure that tripped it) and closed again; Director unreachable (transport
failures in a row, as many as open the breaker) and reachable again (`_Signal`).
Why: docs/design/0010-queue-counted-from-first-call.md,
docs/design/0011-calls-outside-requests-in-the-queue.md,
docs/design/0014-request-deadline-from-arrival.md,
docs/design/0015-keep-the-queue-to-what-director-serves.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import httpx

from control_plane_broker.director.classification import DirectorInternal, DirectorRetryable
from control_plane_broker.errors import (
    CallerGone,
    CapacityReserved,
    CompassDown,
    CompassUnavailable,
)
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import (
    CapacitySchedule,
    Deferred,
    DirectorLoad,
)
from control_plane_broker.overload.priority_slots import FIRST_CALL, FOLLOW_UP, PrioritySlots
from control_plane_broker.overload.reservations import (
    Defer,
    Refuse,
    Reservation,
    ReservationLedger,
    decide,
)
from control_plane_broker.overload.retry_after import reservation_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
# What a call's end says about Director: it answered, it is failing, or an internal error that
# may be either (see `director.classification`).
Verdict = Literal["healthy", "outage", "ambiguous"]
# Asked once a call holds a slot, right before it leaves: False when nobody waits for the answer.
CallerPresent = Callable[[], Awaitable[bool]]


def _unreachable(error: BaseException | None) -> bool:
    """Did the call fail without reaching Compass (refused, reset, timed out)? The Director
    client raises `DirectorRetryable` from the transport error, for Director and for the OAuth
    token endpoint alike."""
    return isinstance(error, DirectorRetryable) and isinstance(
        error.__cause__, httpx.TransportError
    )


def _described(error: BaseException | None) -> dict[str, Any]:
    """An error as log fields: its class and message (the client's messages name the operation
    and the cause, never a token; the log redacts token shapes besides)."""
    if error is None:
        return {}
    return {"error": type(error).__name__, "cause": str(error)[:300]}


class _Signal:
    """The operator's view of Director, as WARNING lines on transitions only: a herd of
    failing calls gives one line when the breaker opens and one when it closes, not one per
    call (this module's lines about single calls are INFO or below)."""

    def __init__(self, *, threshold: int, clock: Callable[[], float]) -> None:
        self._threshold = max(threshold, 1)
        self._clock = clock
        self._opened_at = 0.0  # when the breaker left CLOSED
        self._transport_failures = 0  # calls in a row that did not reach Compass
        self._unreachable_since: float | None = None

    def breaker(self, before: cb.State, after: cb.Breaker, cause: BaseException | None) -> None:
        """The breaker went from `before` to `after`. Only leaving CLOSED and coming back to
        it are told: in between, each open period ends in a probe that either closes it or
        opens it again, and an outage would otherwise log a line per probe (DEBUG)."""
        now = self._clock()
        if before is cb.State.CLOSED:
            self._opened_at = now
            log.warning(
                "circuit breaker opened: Director calls are refused, one probe per open period",
                extra={"breaker": "open", "failures": after.failures, **_described(cause)},
            )
        elif after.state is cb.State.CLOSED:
            log.warning(
                "circuit breaker closed: a probe passed, Director calls go out again",
                extra={"breaker": "closed", "open_seconds": round(now - self._opened_at, 1)},
            )
        else:
            log.debug("circuit breaker %s", after.state.value, extra={"breaker": after.state.value})

    def call_ended(self, error: BaseException | None) -> None:
        """A call that left ended, with `error` or an answer (None). Unreachable after as many
        transport failures in a row as open the breaker, so that one timeout among answers is
        no transition; reachable again at the first call that reached Compass, whatever it
        answered (a 503 is an answer)."""
        if not _unreachable(error):
            self._transport_failures = 0
            if self._unreachable_since is not None:
                log.warning(
                    "Director reachable again",
                    extra={
                        "director": "reachable",
                        "unreachable_seconds": round(self._clock() - self._unreachable_since, 1),
                    },
                )
                self._unreachable_since = None
            return
        self._transport_failures += 1
        if self._unreachable_since is None and self._transport_failures >= self._threshold:
            self._unreachable_since = self._clock()
            log.warning(
                "Director unreachable: its calls fail in transport",
                extra={
                    "director": "unreachable",
                    "failures": self._transport_failures,
                    **_described(error),
                },
            )


def _calls(reservation: Reservation | None) -> int:
    """The calls a waiting call stands for: its reservation's, for a request's first call (its
    follow-ups are served right after it); itself, otherwise."""
    return 1 if reservation is None else reservation.calls


class DirectorLimiter:
    def __init__(
        self,
        *,
        policy: cb.BreakerPolicy,
        max_concurrency: int,
        queue_timeout: float,
        clock: Callable[[], float],
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self._policy = policy
        self._breaker = cb.Breaker()
        # A waiting first call is tagged with its reservation, so that it can be sent away with a
        # reservation later when the schedule sees it cannot be served in time (`_shed`).
        self._slots: PrioritySlots[Reservation] = PrioritySlots(max_concurrency, clock)
        self._queue_timeout = queue_timeout
        self._slot_wait = 2 * queue_timeout  # the longest a reserved call waits for a slot
        self._clock = clock
        self._on_state = on_state
        self._signal = _Signal(threshold=policy.failure_threshold, clock=clock)
        self.schedule = CapacitySchedule(capacity=max_concurrency, max_wait=queue_timeout)
        # Reserved calls that found no slot in time, or were sent out of the queue because they
        # would not (`_shed`): the schedule's estimate was short (the answer is a 503
        # compass-unavailable, as for an open breaker, so count it apart).
        self._slot_timeouts = 0
        # Calls for a waiting caller held back because their answer would come after the
        # caller's deadline (answered 503 capacity-booked, with a reservation for the call).
        self._late_calls = 0
        self._ledger = ReservationLedger()
        # Calls outside any reservation (the reconciler's) waiting for a slot, and the
        # follow-ups they promised: not in the slot queue yet, but served before every first
        # call queued now (docs/design/0011). A reservation's calls are in
        # `ReservationLedger.ahead` from its first call on.
        self._unreserved_waiting = 0
        self._owed_follow_ups = 0

    def _queued_calls(self) -> float:
        return (
            self._ledger.ahead(self.schedule.latency)
            + self._unreserved_waiting
            + self._owed_follow_ups
        )

    @property
    def state(self) -> cb.State:
        return self._breaker.state

    def refusing(self) -> bool:
        """Would a call be refused now? Judged at this moment, also when no call has arrived
        since the open period ended (the breaker moves only when one does)."""
        return cb.would_refuse(self._breaker, self._policy, self._clock())

    def backlogged(self) -> bool:
        """Does work wait for Director: calls waiting for a slot, or its capacity booked ahead
        of now? What no answer waits for yields to it (`overload/deferred_writes`)."""
        return self._slots.waiting > 0 or self.schedule.reserved_until > self._clock()

    def snapshot(self) -> DirectorLoad:
        schedule = self.schedule
        schedule.expire(self._clock())  # right at scrape time, also with no request since
        return DirectorLoad(
            in_flight=self._slots.taken,
            waiting=self._slots.waiting,
            call_seconds=schedule.latency,
            reserved_ahead_seconds=max(0.0, schedule.reserved_until - self._clock()),
            reservations=schedule.reservations(),
            shift_seconds=schedule.shift,
            slot_timeouts=self._slot_timeouts,
            late_calls=self._late_calls,
        )

    def _set(self, breaker: cb.Breaker, cause: BaseException | None = None) -> None:
        """Every change of the breaker goes through here: `cause` is the failure that moved it."""
        before = self._breaker.state
        self._breaker = breaker
        if breaker.state is before:
            return
        if self._on_state is not None:
            self._on_state(breaker.state.value)
        self._signal.breaker(before, breaker, cause)

    def reserve(self, key: str, *, calls: int, deadline: float | None = None) -> Reservation:
        """A reservation of `calls` Director calls for `key`, to pass to each of them and to
        `finish` once the request is answered. Raises `CompassDown` at once while the breaker
        would refuse a call anyway (with a reservation after the next probe), and
        `CapacityReserved` when the schedule defers the request (`reservations.decide`).
        `deadline` (this clock's time): when the request's caller stops waiting; the request
        gets a reservation only when its wait and calls end before, and its calls for that
        caller leave only when their answer can be back before (`call`)."""
        decision = decide(
            self.schedule,
            self._breaker,
            self._policy,
            key=key,
            calls=calls,
            now=self._clock(),
            queued_calls=self._queued_calls(),
            deadline=deadline,
        )
        if isinstance(decision, Refuse):
            raise CompassDown("circuit breaker open", retry_after=decision.retry_after)
        if isinstance(decision, Defer):
            raise CapacityReserved("Director capacity is booked", retry_after=decision.retry_after)
        return self._ledger.open(calls, key=key, deadline=deadline)

    def finish(self, reservation: Reservation) -> None:
        """The request of `reservation` is over (answered or given up): it leaves the queue in
        front of Director, and what its calls held is the schedule's sample. Once only."""
        sample = self._ledger.finish(reservation)
        if sample is not None:
            self._observe(sample)

    def _observe(self, sample: float) -> None:
        before = self.schedule.latency
        self.schedule.observe(sample)
        if self.schedule.latency > before:  # a waiter's grant moves later only if it rose
            self._shed()

    def _shed(self) -> None:
        """Sends away, each with a reservation where its calls would have been served, the
        waiting first calls that by the estimate will not get a slot before their slot timeout,
        or whose request will not end by its caller's deadline. Called whenever the estimate
        rises.

        Why: a request is admitted on the estimate of the moment. When Director turns slow, or
        a cold start meets a slow Director before any call of it was measured, the requests
        admitted at the old price hold the queue in front of the slots far beyond its promise.
        Left there, each waited out its slot timeout, got 503 with a second's Retry-After and
        came back to the end of the schedule, while the schedule had counted it in the queue and
        placed every reservation behind it: when they left, Director sat idle until those
        reservations began (issue 35: 45 s of a 213-226 s cold start of 200 runtimes against a
        Director made slow to 3-5 s a call; docs/design/0015). Sent away as soon as the
        estimate shows it, each keeps its place (`CapacitySchedule.hold_place`), and the queue
        the schedule counts is the one the slots will serve.

        Whether a request ends by its deadline is judged at the slowest recent call: kept on
        the average, the requests that then ran late left the queue empty while the agents
        sent away earlier were not back yet (in the virtual-time model with the broker's own
        work before a call, 6 of 16 runs had a second below 80 % of the slots in flight; at the
        slowest, none). But the first waiters, as many as there are slots, stay whatever their
        deadline: one call for each slot bridges the seconds an agent sent away needs to be
        back (its Retry-After, its jitter, the broker's work before its call), also when the
        calls in flight end together, as a cold start's first ones do; one that then runs late
        has only its token held back (`_refuse_if_late`), its registration done (against the
        simulator, a cold start had a second at 62 % when this queue ran dry). Kept too: the calls
        of no request (nobody to tell a time); follow-ups (the token after a registration goes
        first, and is held to its deadline when it has its slot).

        The answer is a deferral's, 503 `capacity-booked` with the reservation in Retry-After
        and no jitter (`CapacityReserved`; counted with the slot timeouts): Compass is not
        failing, so neither the mapping's status nor an Event says it is (each cost a KCP
        write per request sent away in a cold start), and the breaker hears nothing. A
        registration refused so is known not to have left (`classification.may_have_written`),
        and the agent's next request registers without a look-up."""
        now = self._clock()
        price = self.schedule.latency
        per_slot = price / max(self._slots.capacity, 1)
        slowest = self.schedule.slowest_recent_call()  # whether it surely ends in time
        # Mostly nothing leaves: the last waiter's grant before every waiter's limit, checked
        # without sorting the queue (this runs at every rise of the estimate).
        last = now + self._queued_calls() * per_slot
        if all(
            last <= waiter.since + self._slot_wait
            and (
                waiter.tag.deadline is None
                or last + waiter.tag.calls * slowest <= waiter.tag.deadline
            )
            for waiter in self._slots.queue(ordered=False)
            if waiter.tag is not None
        ):
            return
        queue = self._slots.queue()
        # Work in front of the first waiter, in calls: those in flight and the follow-ups they
        # owe, which go before every first call.
        work = max(0.0, self._queued_calls() - sum(_calls(w.tag) for w in queue))
        leaving = []
        staying = 0
        for waiter in queue:
            reservation = waiter.tag
            if reservation is not None and not reservation.finished:
                granted = now + work * per_slot
                if granted > waiter.since + self._slot_wait or (
                    reservation.deadline is not None
                    and granted + reservation.calls * slowest > reservation.deadline
                    and staying >= self._slots.capacity
                ):
                    leaving.append(waiter)
                    continue
            staying += 1
            work += _calls(reservation)
        if not leaving:
            return
        for waiter in leaving:  # out of the queue first: each reservation is placed after it
            assert waiter.tag is not None
            self._ledger.finish(waiter.tag)
        before = self._queued_calls()  # the queue that stays: served before those leaving
        for waiter in leaving:
            reservation = waiter.tag
            assert reservation is not None
            wait = self.schedule.hold_place(
                reservation.key, calls=reservation.calls, now=now, queued_calls=before
            ).wait
            before += reservation.calls
            self._slot_timeouts += 1
            self._slots.refuse(
                waiter,
                CapacityReserved(
                    "Director's slots cannot serve this call in time: come back at its reservation",
                    retry_after=self._reservation_wait(wait),
                ),
            )
        log.info(
            "Director calls sent away with a reservation: the slots cannot serve them in time",
            extra={"calls": len(leaving), "estimate_seconds": round(price, 3)},
        )

    def _reservation_wait(self, wait: float) -> float:
        return reservation_wait(wait, max_wait=self._queue_timeout)

    async def call(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        reservation: Reservation | None = None,
        subject: str = "",
        follow_up: bool = False,
        then: int = 0,
        caller_present: CallerPresent | None = None,
    ) -> T:
        """`reservation`: the request's (`reserve`), when the call is one of a request's: it
        is counted and priced as the request's and, for a waiting caller, held to its deadline;
        None for calls of no request (the reconciler's), or once the request is finished (a task
        it started, outliving it, is on its own).
        `subject`: the runtime the call is about (see `cb.record_ambiguous`).
        `follow_up`: this call continues a request that already spent a Director call.
        `then`: how many follow-up calls the request makes after this one succeeds."""
        breaker, permit = cb.admit(self._breaker, self._policy, self._clock())
        self._set(breaker)
        if not permit.allowed:
            raise CompassUnavailable("circuit breaker open", retry_after=permit.retry_after)
        probe = breaker.state is cb.State.HALF_OPEN
        verdict: Verdict | None = None  # None: no verdict on Director
        error: BaseException | None = None
        if reservation is not None and reservation.finished:
            reservation = None
        owed = then if reservation is None else 0  # a reservation's calls are reserved already
        if reservation is not None:
            self._ledger.asking(reservation)  # in the queue in front of Director from now on
        self._owed_follow_ups += owed
        try:
            granted = await self._slot(follow_up=follow_up, reservation=reservation)
            try:
                if not cb.may_leave_queue(self._breaker, probe=probe):
                    raise CompassUnavailable(
                        "circuit breaker opened while the call waited for a slot",
                        retry_after=cb.seconds_until_probe(
                            self._breaker, self._policy, self._clock()
                        ),
                    )
                if caller_present is not None and not await caller_present():
                    raise CallerGone("the caller hung up while the call waited for a slot")
                if caller_present is not None and reservation is not None:
                    self._refuse_if_late(reservation)
                result = await self._timed(fn, granted, reservation)
            finally:
                self._slots.release()
            verdict = "healthy"
            return result
        except DirectorInternal as exc:
            verdict, error = "ambiguous", exc
            raise
        except DirectorRetryable as exc:
            verdict, error = "outage", exc
            raise
        except (CompassUnavailable, CallerGone, CapacityReserved):
            # Our own queue timeout, breaker, a caller gone or late: no verdict on Director.
            raise
        except Exception as exc:
            verdict, error = "healthy", exc  # a permanent answer: Director is up and talking
            raise
        finally:
            self._owed_follow_ups -= owed
            self._settle(verdict, probe=probe, subject=subject, error=error)

    def _refuse_if_late(self, reservation: Reservation) -> None:
        """Raises `CapacityReserved`, with a reservation for this call, when its answer would
        reach the caller after its deadline by the schedule's estimate of a call. The request's
        own work after its reservation (KCP writes, a slow event loop) is not estimated ahead: it is
        seen here, before a one-time token is made that nobody would receive, and the agent
        comes back for it at its reservation (its registration is done: one call left)."""
        now = self._clock()
        if reservation.deadline is None or now + self.schedule.latency <= reservation.deadline:
            return
        self._late_calls += 1
        verdict = self.schedule.reserve(
            reservation.key, calls=1, now=now, queued_calls=self._queued_calls(), not_before=now
        )
        wait = verdict.wait if isinstance(verdict, Deferred) else 0.0
        log.info(
            "Director call held back: its answer would come after the caller's deadline",
            extra={
                "late_seconds": round(now + self.schedule.latency - reservation.deadline, 3),
                "estimate_seconds": round(self.schedule.latency, 3),
            },
        )
        raise CapacityReserved(
            "the answer would come after the caller stops waiting",
            retry_after=self._reservation_wait(wait),
        )

    async def _slot(self, *, follow_up: bool, reservation: Reservation | None) -> float:
        """Waits for a slot (follow-ups first); answers when it was granted."""
        waiting = int(reservation is None)
        self._unreserved_waiting += waiting
        first = reservation is not None and not follow_up and reservation.use.calls == 0
        try:
            return await self._slots.acquire(
                FOLLOW_UP if follow_up else FIRST_CALL,
                self._slot_wait,
                reservation if first else None,
            )
        except TimeoutError:
            self._slot_timeouts += 1
            log.info(
                "Director call found no slot in time",
                extra={
                    "waited_seconds": self._slot_wait,
                    "follow_up": follow_up,
                    "estimate_seconds": round(self.schedule.latency, 3),
                },
            )
            raise CompassUnavailable("too many Director calls in flight", retry_after=1.0) from None
        finally:
            self._unreserved_waiting -= waiting

    async def _timed(
        self, fn: Callable[[], Awaitable[T]], granted: float, reservation: Reservation | None
    ) -> T:
        """`fn()` on the slot granted at `granted`. The slot as this process holds it, from its
        grant to the answer (Director's latency and the broker's own delays around it: the loop
        resuming the waiter, the check on the caller, parsing the answer), is what the schedule
        prices: the reservation's, or a call's of its own outside any reservation."""
        try:
            result = await fn()
        except BaseException:
            if reservation is not None:
                self._ledger.spent(reservation, self._clock() - granted, ok=False)
            raise
        if reservation is not None:
            self._ledger.spent(reservation, self._clock() - granted, ok=True)
        else:
            self._observe(self._clock() - granted)
        return result

    def _settle(
        self, verdict: Verdict | None, *, probe: bool, subject: str, error: BaseException | None
    ) -> None:
        if verdict is not None:
            self._signal.call_ended(error)
        if verdict == "outage":
            self._set(cb.record_failure(self._breaker, self._policy, self._clock()), error)
        elif verdict == "ambiguous":
            self._set(
                cb.record_ambiguous(self._breaker, self._policy, self._clock(), subject), error
            )
        elif verdict == "healthy" and self._breaker.state is not cb.State.OPEN:
            self._set(cb.record_success(self._breaker))
        elif verdict is None and probe and self._breaker.state is cb.State.HALF_OPEN:
            # The probe was cancelled or timed out in the queue: let the next caller probe.
            self._set(cb.release_probe(self._breaker))
