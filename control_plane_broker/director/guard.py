"""Protects Director: a circuit breaker, a booking calendar and a global concurrency limit.

Holds: while the breaker is open no call leaves the process, also none that was already waiting
for a slot when it opened, and a caller learns that before it costs anything (`refuse_if_open`);
at most `max_concurrency` calls are in flight; a request is admitted only when its turn comes
within the queue timeout by the calendar's estimate (`book`), otherwise it is told when to come
back; the second call of a request that already holds Director's attention (the token after a
registration) is served before first calls, so admitted requests finish in the time promised, and
the calendar counts it in the queue from the moment its first call queues (it will go ahead of
every first call behind that one);
a call that still waits longer than twice the queue timeout for a slot gets `CompassUnavailable`;
a call whose caller has hung up by the time it gets a slot does not leave (`CallerGone`): after a
restart thousands of agents time out while their requests queue, and each of those calls would
spend Director's time (and a one-time token) on nobody while the agents that stayed wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from control_plane_broker import circuit_breaker as cb
from control_plane_broker.director.admission import Admitted, Calendar, GuardSnapshot, advise
from control_plane_broker.director.errors import DirectorFailed, DirectorRetryable
from control_plane_broker.errors import CallerGone, CompassDown, CompassUnavailable, TurnBooked

log = logging.getLogger(__name__)

T = TypeVar("T")
# What a call's end says about Director: it answered, it is failing, or an internal error that
# may be either (see `director.errors`).
Verdict = Literal["healthy", "outage", "ambiguous"]
# Asked once a call holds a slot, right before it leaves: False when nobody waits for the answer.
CallerPresent = Callable[[], Awaitable[bool]]

FIRST_CALL = 1
FOLLOW_UP = 0  # served first: the request has already spent Director's time


class PrioritySlots:
    """A counting semaphore whose waiters are served by (priority, arrival).

    A released slot is handed straight to the next waiter, so `free > 0` implies nobody waits."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.waiting = 0

    async def acquire(self, priority: int, wait_seconds: float) -> None:
        if self._free > 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        self.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(future), wait_seconds)
        except BaseException:
            if future.done() and not future.cancelled():
                self.release()  # granted just as we gave up: pass the slot on
            else:
                future.cancel()
                self.waiting -= 1
            raise

    @property
    def taken(self) -> int:
        return self.capacity - self._free

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                self.waiting -= 1
                future.set_result(None)  # the slot moves to the waiter as it is
                return
        self._free += 1


class DirectorGuard:
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
        self._slots = PrioritySlots(max_concurrency)
        self._queue_timeout = queue_timeout
        self._clock = clock
        self._on_state = on_state
        self.calendar = Calendar(capacity=max_concurrency, max_wait=queue_timeout)
        # Admitted calls that still found no slot in time: the calendar's estimate was short
        # (the answer is a 503 compass-unavailable, as for an open breaker, so count it apart).
        self._slot_timeouts = 0
        # Follow-up calls promised by first calls that wait or are in flight. They are not in
        # the slot queue yet, but they will be served before every first call queued now:
        # measured, a queue counted without them made admitted registrations wait twice the
        # time the calendar promised (and time out) after an outage.
        self._owed_follow_ups = 0

    def _queued_calls(self) -> int:
        return self._slots.waiting + self._owed_follow_ups

    @property
    def state(self) -> cb.State:
        return self._breaker.state

    def refusing(self) -> bool:
        """Would a call be refused now? Judged at this moment, also when no call has arrived
        since the open period ended (the breaker moves only when one does)."""
        return cb.would_refuse(self._breaker, self._policy, self._clock())

    def snapshot(self) -> GuardSnapshot:
        calendar = self.calendar
        return GuardSnapshot(
            in_flight=self._slots.taken,
            waiting=self._slots.waiting,
            call_seconds=calendar.latency,
            booked_ahead_seconds=max(0.0, calendar.booked_until - self._clock()),
            tickets=calendar.tickets(),
            shift_seconds=calendar.shift,
            slot_timeouts=self._slot_timeouts,
        )

    def _set(self, breaker: cb.Breaker) -> None:
        if breaker.state is not self._breaker.state and self._on_state is not None:
            self._on_state(breaker.state.value)
        self._breaker = breaker

    def refuse_if_open(self, key: str, *, calls: int) -> None:
        """The cheap refusal: raises at once while the breaker would refuse a call anyway, with
        a turn after the next probe (see `Calendar.book`), not one moment for everybody."""
        now = self._clock()
        if not cb.would_refuse(self._breaker, self._policy, now):
            return
        probe_at = now + cb.seconds_until_probe(self._breaker, self._policy, now)
        verdict = self.calendar.book(
            key, calls=calls, now=now, queued_calls=self._queued_calls(), not_before=probe_at
        )
        wait = verdict.retry_after if not isinstance(verdict, Admitted) else probe_at - now
        raise CompassDown("circuit breaker open", retry_after=self._advise(wait))

    def book(self, key: str, *, calls: int) -> None:
        """Admits a request of `calls` Director calls for `key`, or raises `TurnBooked`."""
        verdict = self.calendar.book(
            key, calls=calls, now=self._clock(), queued_calls=self._queued_calls()
        )
        if not isinstance(verdict, Admitted):
            raise TurnBooked(
                "Director capacity is booked", retry_after=self._advise(verdict.retry_after)
            )

    def _advise(self, wait: float) -> float:
        return advise(wait, max_wait=self._queue_timeout)

    def release_booking(self, key: str) -> None:
        self.calendar.cancel(key)

    async def call(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        subject: str = "",
        follow_up: bool = False,
        then: int = 0,
        caller_present: CallerPresent | None = None,
    ) -> T:
        """`subject`: the runtime the call is about (see `cb.record_ambiguous`).
        `follow_up`: this call continues a request that already spent a Director call.
        `then`: how many follow-up calls the request makes after this one succeeds."""
        breaker, admission = cb.admit(self._breaker, self._policy, self._clock())
        self._set(breaker)
        if not admission.allowed:
            raise CompassUnavailable("circuit breaker open", retry_after=admission.retry_after)
        probe = breaker.state is cb.State.HALF_OPEN
        verdict: Verdict | None = None  # None: no verdict on Director
        self._owed_follow_ups += then
        try:
            try:
                await self._slots.acquire(
                    FOLLOW_UP if follow_up else FIRST_CALL, 2 * self._queue_timeout
                )
            except TimeoutError:
                self._slot_timeouts += 1
                log.info(
                    "Director call found no slot in time",
                    extra={
                        "waited_seconds": 2 * self._queue_timeout,
                        "follow_up": follow_up,
                        "estimate_seconds": round(self.calendar.latency, 3),
                    },
                )
                raise CompassUnavailable(
                    "too many Director calls in flight", retry_after=1.0
                ) from None
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
                started = self._clock()
                result = await fn()
                self.calendar.observe(self._clock() - started)
            finally:
                self._slots.release()
            verdict = "healthy"
            return result
        except DirectorRetryable:
            verdict = "outage"
            raise
        except DirectorFailed:
            verdict = "ambiguous"
            raise
        except (CompassUnavailable, CallerGone):
            raise  # our own queue timeout, breaker or a caller gone: no verdict on Director
        except Exception:
            verdict = "healthy"  # a permanent answer: Director is up and talking
            raise
        finally:
            self._owed_follow_ups -= then
            self._settle(verdict, probe=probe, subject=subject)

    def _settle(self, verdict: Verdict | None, *, probe: bool, subject: str) -> None:
        if verdict == "outage":
            self._set(cb.record_failure(self._breaker, self._policy, self._clock()))
        elif verdict == "ambiguous":
            self._set(cb.record_ambiguous(self._breaker, self._policy, self._clock(), subject))
        elif verdict == "healthy" and self._breaker.state is not cb.State.OPEN:
            self._set(cb.record_success(self._breaker))
        elif verdict is None and probe and self._breaker.state is cb.State.HALF_OPEN:
            # The probe was cancelled or timed out in the queue: let the next caller probe.
            self._set(cb.release_probe(self._breaker))
