"""Protects Director: a circuit breaker, a booking calendar and a global concurrency limit.

Holds: while the breaker is open no call leaves the process, also none that was already waiting
for a slot when it opened, and a caller learns that before it costs anything (`refuse_if_open`);
at most `max_concurrency` calls are in flight; a request is admitted only when its turn comes
within the queue timeout by the calendar's estimate (`book`), otherwise it is told when to come
back; the queue in front of a new request is counted as what admitted requests booked and their
calls have not held yet, from the moment a request's first call asks for a slot (its look-ups,
its registration, its token; before that it is in the broker's own work and in the calendar's
bookings), plus the calls outside any request that wait; each request's slot time, grant to
answer over all its calls, per call it booked, is what the calendar measures (`admission`); the
second call of a request that already holds Director's attention (the token after a
registration) is served before first calls, so admitted requests finish in the time promised;
a call that still waits longer than twice the queue timeout for a slot gets `CompassUnavailable`;
a call whose caller has hung up by the time it gets a slot does not leave (`CallerGone`): after a
restart thousands of agents time out while their requests queue, and each of those calls would
spend Director's time (and a one-time token) on nobody while the agents that stayed wait.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from control_plane_broker.director.classification import DirectorFailed, DirectorRetryable
from control_plane_broker.errors import CallerGone, CompassDown, CompassUnavailable, TurnBooked
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import (
    Admissions,
    Admitted,
    Calendar,
    GuardSnapshot,
    Request,
    advise,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# What a call's end says about Director: it answered, it is failing, or an internal error that
# may be either (see `director.classification`).
Verdict = Literal["healthy", "outage", "ambiguous"]
# Asked once a call holds a slot, right before it leaves: False when nobody waits for the answer.
CallerPresent = Callable[[], Awaitable[bool]]

FIRST_CALL = 1
FOLLOW_UP = 0  # served first: the request has already spent Director's time


class _Served:
    """The admitted request a task serves now (its calls' slot time is the request's), seen
    through a context variable by the task and the tasks it starts."""

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.request: Request | None = None


_SERVED: contextvars.ContextVar[_Served | None] = contextvars.ContextVar(
    "director_request", default=None
)


class PrioritySlots:
    """A counting semaphore whose waiters are served by (priority, arrival).

    A released slot is handed straight to the next waiter, so `free > 0` implies nobody waits.
    `acquire` answers when the slot became the caller's: for a waiter, the moment it was handed
    over, before the event loop got round to resuming the waiter (the slot is held meanwhile)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._free = capacity
        self._clock = clock
        self._waiters: list[tuple[int, int, asyncio.Future[float]]] = []
        self._seq = itertools.count()
        self.waiting = 0

    async def acquire(self, priority: int, wait_seconds: float) -> float:
        if self._free > 0:
            self._free -= 1
            return self._clock()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        self.waiting += 1
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait_seconds)
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
                future.set_result(self._clock())  # the slot moves to the waiter as it is
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
        self._slots = PrioritySlots(max_concurrency, clock)
        self._queue_timeout = queue_timeout
        self._clock = clock
        self._on_state = on_state
        self.calendar = Calendar(capacity=max_concurrency, max_wait=queue_timeout)
        # Admitted calls that still found no slot in time: the calendar's estimate was short
        # (the answer is a 503 compass-unavailable, as for an open breaker, so count it apart).
        self._slot_timeouts = 0
        self._admissions = Admissions()
        # Calls outside any admitted request (the reconciler's) waiting for a slot, and the
        # follow-ups they promised: not in the slot queue yet, but served before every first
        # call queued now (measured, a queue counted without them made admitted registrations
        # wait twice the time the calendar promised, and time out, after an outage). An
        # admitted request's calls are in `Admissions.ahead` from its first call on.
        self._unbooked_waiting = 0
        self._owed_follow_ups = 0

    def _queued_calls(self) -> float:
        return (
            self._admissions.ahead(self.calendar.latency)
            + self._unbooked_waiting
            + self._owed_follow_ups
        )

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
        self._track(calls)

    def _track(self, calls: int) -> None:
        """The admitted request runs in the current task and ends with it (one request per
        task, as the HTTP server runs them); a task that books again has finished its last."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop: nothing to measure it by
            task = None
        if task is None:
            return
        served = _SERVED.get()
        if served is None or served.task is not task:
            served = _Served(task)
            _SERVED.set(served)
            task.add_done_callback(lambda _: self._finish(served.request))
        self._finish(served.request)
        served.request = self._admissions.admit(calls)

    def _finish(self, request: Request | None) -> None:
        if request is None:
            return
        sample = self._admissions.finish(request)
        if sample is not None:
            self.calendar.observe(sample)

    def _advise(self, wait: float) -> float:
        return advise(wait, max_wait=self._queue_timeout)

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
        served = _SERVED.get()
        request = served.request if served is not None else None
        if request is not None and request.finished:
            request = None  # a task its request started, outliving it: on its own now
        owed = then if request is None else 0  # an admitted request's calls are booked
        if request is not None:
            self._admissions.asking(request)  # in the queue in front of Director from now on
        self._owed_follow_ups += owed
        try:
            granted = await self._slot(follow_up=follow_up, booked=request is not None)
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
                result = await self._timed(fn, granted, request)
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
            self._owed_follow_ups -= owed
            self._settle(verdict, probe=probe, subject=subject)

    async def _slot(self, *, follow_up: bool, booked: bool) -> float:
        """Waits for a slot (follow-ups first); answers when it was granted."""
        waiting = int(not booked)
        self._unbooked_waiting += waiting
        try:
            return await self._slots.acquire(
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
            raise CompassUnavailable("too many Director calls in flight", retry_after=1.0) from None
        finally:
            self._unbooked_waiting -= waiting

    async def _timed(
        self, fn: Callable[[], Awaitable[T]], granted: float, request: Request | None
    ) -> T:
        """`fn()` on the slot granted at `granted`. The slot as this process holds it, from its
        grant to the answer (Director's latency and the broker's own delays around it: the loop
        resuming the waiter, the check on the caller, parsing the answer), is what the calendar
        prices: the request's, or a call's of its own outside any request (`admission`)."""
        try:
            result = await fn()
        except BaseException:
            if request is not None:
                self._admissions.spent(request, self._clock() - granted, ok=False)
            raise
        if request is not None:
            self._admissions.spent(request, self._clock() - granted, ok=True)
        else:
            self.calendar.observe(self._clock() - granted)
        return result

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
