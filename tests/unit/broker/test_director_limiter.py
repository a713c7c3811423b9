"""The Director limiter (`overload/director_limiter`): breaker, capacity schedule and priority
slots in front of every Director call, and a request's whole use of the slots."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import httpx
import pytest

from control_plane_broker.director.classification import DirectorRetryable
from control_plane_broker.errors import CapacityReserved, CompassUnavailable
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import Admit, Deferred
from control_plane_broker.overload.director_limiter import DirectorLimiter
from control_plane_broker.overload.reservations import ReservationLedger
from control_plane_broker.overload.retry_after import reservation_wait
from tests.unit.broker.conditions import until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(clock: Clock, **kwargs: float) -> DirectorLimiter:
    return DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=1, open_seconds=30),
        max_concurrency=int(kwargs.pop("max_concurrency", 2)),
        queue_timeout=kwargs.pop("queue_timeout", 1.0),
        clock=clock,
    )


def test_reserve_refuses_with_the_wait_and_no_jitter() -> None:
    clock = Clock()
    g = limiter(clock)
    for i in range(21):
        g.reserve(f"rt-{i}", calls=1)
    with pytest.raises(CapacityReserved) as info:
        g.reserve("late", calls=1)
    # its reservation is 1.05 s ahead: told the whole second that gets it there by then
    assert info.value.retry_after == reservation_wait(1.05, max_wait=1.0) == 1.0
    assert (info.value.status, info.value.slug, info.value.spread) == (
        503,
        "capacity-booked",
        False,
    )
    clock.now += 1.05
    g.reserve("late", calls=1)  # its reservation: admitted on its reservation


async def test_while_open_the_fleet_is_spread_over_reservations_after_the_probe() -> None:
    clock = Clock()
    g = limiter(clock)

    async def failing() -> None:
        raise DirectorRetryable("503")

    with pytest.raises(CompassUnavailable):
        await g.call(failing)
    assert g.state is cb.State.OPEN
    waits = []
    for index in range(100):
        with pytest.raises(CompassUnavailable) as info:
            g.reserve(f"rt-{index}", calls=2)
        waits.append(info.value.retry_after)
    # Nobody before the probe; then one after the other at Director's pace, not all at once
    # (each told the time that gets it there by its reservation, see `reservation_wait`).
    per_runtime = 2 * g.schedule.seconds_per_call()
    assert waits == [reservation_wait(30 + i * per_runtime, max_wait=1.0) for i in range(100)]
    assert min(waits) >= 29
    # Asking again before its reservation gives the same reservation (no second one).
    with pytest.raises(CompassUnavailable) as again:
        g.reserve("rt-50", calls=2)
    assert again.value.retry_after == waits[50]


async def test_the_refusal_while_open_is_cheap_and_does_not_take_the_probe() -> None:
    clock = Clock()
    g = limiter(clock)

    async def failing() -> None:
        raise DirectorRetryable("503")

    g.reserve("rt-1", calls=1)  # closed: nothing to refuse
    with pytest.raises(CompassUnavailable):
        await g.call(failing)
    assert g.state is cb.State.OPEN
    with pytest.raises(CompassUnavailable) as info:
        g.reserve("rt-1", calls=1)
    assert info.value.retry_after == reservation_wait(30, max_wait=1.0) == 29
    assert not info.value.spread  # the reservation is the spread: no random seconds on top
    clock.now += 30
    g.reserve("rt-1", calls=1)  # the probe: not refused ...
    g.reserve("rt-1", calls=1)  # ... also when asked twice, since asking takes nothing

    async def probe() -> str:
        return "ok"

    assert await g.call(probe) == "ok"  # the probe was still there to take
    assert g.state is cb.State.CLOSED


async def test_a_call_outside_any_request_is_measured_from_its_slots_grant() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 1.1

    async def fast() -> None:
        clock.now += 0.1

    async def late_waiter() -> None:
        await g.call(fast)

    first = asyncio.create_task(g.call(hold))
    await holding.wait()
    waiter = asyncio.create_task(late_waiter())
    await until(lambda: g.snapshot().waiting == 1)
    release.set()
    await first
    assert g.schedule.latency == pytest.approx(0.1 + 0.2 * 1.0)
    # The slot was handed over at once, but the loop resumed the waiter only after 0.4 s: the
    # slot was held (and Director idle) for that time too.
    clock.now += 0.4
    await waiter
    assert g.schedule.latency == pytest.approx(0.3 + 0.2 * (0.5 - 0.3))


# --- a request's whole use of the slots -------------------------------------------------------


def test_a_finished_request_costs_its_slot_time_per_call_it_reserved() -> None:
    ledger = ReservationLedger()
    request = ledger.open(2)
    other = ledger.open(1)
    assert ledger.outstanding == 3
    # Two look-ups it did not reserve, the registration and the token: four calls held slots.
    for seconds in (0.05, 0.05, 0.12, 0.08):
        ledger.spent(request, seconds, ok=True)
    assert ledger.finish(request) == pytest.approx(0.3 / 2)
    assert ledger.outstanding == 1
    assert ledger.finish(request) is None  # once only
    assert ledger.outstanding == 1
    assert ledger.finish(other) is None  # no call made: nothing learnt of a call's cost
    assert ledger.outstanding == 0
    # One that ended after one of its two calls (its token held back or sent away) is priced
    # by the call it made, not half of it.
    short = ledger.open(2)
    ledger.spent(short, 4.0, ok=True)
    assert ledger.finish(short) == pytest.approx(4.0)


def test_a_request_with_a_failed_call_teaches_nothing_but_is_no_longer_outstanding() -> None:
    ledger = ReservationLedger()
    request = ledger.open(2)
    ledger.spent(request, 0.1, ok=True)
    ledger.spent(request, 10.0, ok=False)  # a timeout is no pace of Director's
    assert ledger.finish(request) is None
    assert ledger.outstanding == 0


def test_a_request_is_ahead_from_its_first_call_with_what_its_calls_have_not_held_yet() -> None:
    ledger = ReservationLedger()
    request = ledger.open(2)
    assert ledger.ahead(0.1) == 0  # reserved, still in the broker's own work
    ledger.asking(request)  # its first call asks for a slot
    assert ledger.ahead(0.1) == 2
    ledger.asking(request)  # its second: the request is in the queue once
    assert ledger.ahead(0.1) == 2
    ledger.spent(request, 0.1, ok=True)  # registered
    assert ledger.ahead(0.1) == pytest.approx(1)
    other = ledger.open(2)
    ledger.asking(other)
    ledger.spent(request, 0.2, ok=True)  # its token took twice the price ...
    # ... which is counted against the others' calls: the price is an average.
    assert ledger.ahead(0.1) == pytest.approx(1)
    assert ledger.ahead(0.3) == pytest.approx(3)  # by a dearer price, more is left
    assert ledger.finish(request) == pytest.approx(0.15)
    assert ledger.ahead(0.1) == pytest.approx(2)  # the other's two calls, none held yet
    ledger.finish(other)
    assert (ledger.ahead(0.1), ledger.started, ledger.spent_seconds) == (0, 0, 0)
    never = ledger.open(1)  # finished before any call asked: never in the queue
    assert ledger.finish(never) is None
    ledger.asking(never)
    assert ledger.ahead(0.1) == 0


async def test_the_schedule_learns_a_requests_slot_time_per_reserved_call_when_it_ends() -> None:
    clock = Clock()
    g = limiter(clock)

    reservation = g.reserve("rt-1", calls=2)
    for seconds in (0.2, 0.2, 0.5, 0.3):  # two look-ups, register, token

        async def fn(seconds: float = seconds) -> None:
            clock.now += seconds

        await g.call(fn, reservation=reservation)
    assert g.schedule.latency == 0.1  # nothing learnt before the request is over
    g.finish(reservation)
    assert g.schedule.latency == pytest.approx(0.1 + 0.2 * (1.2 / 2 - 0.1))


async def test_reservations_count_in_the_queue_from_first_call_to_their_finish() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=1.0)  # 0.1 s a reserved call, one at a time
    holding, release = asyncio.Event(), asyncio.Event()
    go, written = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 0.1

    async def call() -> None:
        clock.now += 0.1  # what the schedule prices: its estimate stays put

    async def request(key: str) -> None:
        reservation = g.reserve(key, calls=2)
        await go.wait()  # reserved, still in the broker's own work (its mapping written to KCP)
        await g.call(call, reservation=reservation, then=1)  # registers ...
        await g.call(call, reservation=reservation, follow_up=True)  # ... and asks for the token
        await written.wait()  # its status written to KCP, its answer not sent yet
        g.finish(reservation)

    tasks = [asyncio.create_task(request(f"rt-{i}")) for i in range(3)]
    await until(lambda: g._ledger.outstanding == 6)
    clock.now += 1.0  # their reservations are behind: only the queue can count them now
    holder = asyncio.create_task(g.call(hold))  # a call of the reconciler's holds the slot
    await holding.wait()
    # Reserved, none of their calls asked for a slot yet: not in the queue in front of Director.
    assert g._queued_calls() == 0
    go.set()
    await until(lambda: g.snapshot().waiting == 3)
    # Their registrations wait for the slot: the six calls they reserved are in front (0.6 s).
    assert g._queued_calls() == pytest.approx(6)
    # A request of 5 calls is admitted behind them (its reservation 0.6 s away), the next is not.
    assert g.schedule.reserve("new-0", calls=5, now=clock.now, queued_calls=6) == Admit()
    assert isinstance(g.schedule.reserve("new-1", calls=1, now=clock.now, queued_calls=6), Deferred)
    release.set()
    await holder
    await until(lambda: g._slots.taken == 0 and g.snapshot().waiting == 0)
    # Every reserved call answered (0.6 s held), the requests still busy with KCP: nothing of
    # theirs is left in front of Director, though they have not finished.
    assert g._ledger.outstanding == 6
    assert g._queued_calls() == pytest.approx(0.0, abs=1e-9)
    written.set()
    await asyncio.gather(*tasks)
    assert (g._ledger.outstanding, g._ledger.started) == (0, 0)
    assert g.schedule.latency == pytest.approx(0.1)


async def test_a_request_that_made_fewer_calls_than_it_reserved_is_priced_by_those_made() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=100.0)

    async def fn() -> None:
        clock.now += 0.4

    for i in range(3):
        reservation = g.reserve(f"rt-{i}", calls=2)
        await g.call(fn, reservation=reservation)
        assert g._ledger.outstanding == 2  # only the request it serves now
        g.finish(reservation)
    # Each made one of the two calls it reserved: priced by the call it made (0.4 s), not
    # half of it (the estimate fell just when Director was slow enough to hold calls back).
    # Three samples of 0.4 s, each moving the estimate a fifth of the way from 0.1 s.
    assert g.schedule.latency == pytest.approx(0.4 - (0.4 - 0.1) * 0.8**3)


async def test_a_request_s_calls_are_not_owed_twice_nor_counted_as_unreserved() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=100.0)
    inside = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        inside.set()
        await release.wait()

    async def register() -> None:
        clock.now += 0.1

    async def request() -> None:
        reservation = g.reserve("rt", calls=2)
        await g.call(register, reservation=reservation, then=1)
        g.finish(reservation)

    holder = asyncio.create_task(g.call(hold))
    await inside.wait()
    task = asyncio.create_task(request())
    await until(lambda: g.snapshot().waiting == 1)
    # the request's two reserved calls; the waiting registration and its token are among them
    assert g._queued_calls() == 2
    release.set()
    await asyncio.gather(holder, task)
    assert g._queued_calls() == 0


async def test_a_call_that_finds_no_slot_in_twice_the_queue_timeout_is_refused() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=0.01)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()

    async def never() -> None:
        raise AssertionError("must not run")

    holder = asyncio.create_task(g.call(hold))
    await holding.wait()
    with pytest.raises(CompassUnavailable, match="too many Director calls"):
        await g.call(never)
    release.set()
    await holder
    assert g.state is cb.State.CLOSED  # our own queue, no verdict on Director


async def test_the_queue_counts_the_tokens_that_waiting_registrations_will_ask_for() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=1.0)  # 0.1 s a call, one at a time
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 0.1  # each call takes what the schedule expects: its estimate stays put

    async def register() -> str:
        clock.now += 0.1
        return "registered"

    calls = [asyncio.create_task(g.call(hold))]
    await holding.wait()
    # Six registrations wait for the slot; each one's token will go ahead of any first call
    # queued behind them, so the queue is 12 calls (1.2 s), not 6 (0.6 s): a new request
    # admitted now would wait past the queue timeout.
    calls += [asyncio.create_task(g.call(register, then=1)) for _ in range(6)]
    await until(lambda: g.snapshot().waiting == 6)
    with pytest.raises(CapacityReserved) as info:
        g.reserve("behind", calls=1)
    assert info.value.retry_after == reservation_wait(1.2, max_wait=1.0)
    release.set()
    assert await asyncio.gather(*calls) == [None] + ["registered"] * 6
    # Served, nothing is owed any more: later, nine plain calls waiting (0.9 s) admit a request.
    clock.now += 2.0
    holding.clear()
    release.clear()
    calls = [asyncio.create_task(g.call(hold))]
    await holding.wait()
    calls += [asyncio.create_task(g.call(register)) for _ in range(9)]
    await until(lambda: g.snapshot().waiting == 9)
    g.reserve("next", calls=1)
    release.set()
    await asyncio.gather(*calls)


async def test_a_call_for_a_waiting_caller_leaves_only_if_its_answer_is_back_by_the_deadline() -> (
    None
):
    clock = Clock()
    g = limiter(clock)  # a call is estimated at 0.1 s
    sent: list[str] = []

    async def there() -> bool:
        return True

    def director(name: str, seconds: float):  # type: ignore[no-untyped-def]
        async def fn() -> None:
            sent.append(name)
            clock.now += seconds

        return fn

    async def request() -> None:
        reservation = g.reserve("rt-1", calls=2, deadline=clock.now + 1.0)
        # The registration goes on without looking at the caller: the next request needs it.
        await g.call(director("register", 0.3), reservation=reservation)
        clock.now += 0.65  # the broker's own work (the mapping written to KCP) ran long
        # 0.95 s spent: the token's answer would come at 1.05 s, after the caller's deadline.
        with pytest.raises(CapacityReserved) as info:
            await g.call(
                director("token", 0.1),
                reservation=reservation,
                follow_up=True,
                caller_present=there,
            )
        assert info.value.slug == "capacity-booked"
        g.finish(reservation)

    await asyncio.create_task(request())
    assert sent == ["register"]  # no one-time token made for an answer nobody would get
    assert g.snapshot().late_calls == 1
    assert g.schedule.reservations() == 1  # the call is reserved for its return
    assert g.snapshot().in_flight == 0  # the slot was given back

    async def back() -> None:
        # admitted on its reservation
        reservation = g.reserve("rt-1", calls=1, deadline=clock.now + 1.0)
        await g.call(
            director("token", 0.1), reservation=reservation, follow_up=True, caller_present=there
        )
        g.finish(reservation)

    await asyncio.create_task(back())
    assert sent == ["register", "token"]
    assert g.schedule.reservations() == 0


def test_the_gauges_drop_reservations_of_agents_that_never_came_back_without_a_request() -> None:
    clock = Clock()
    g = limiter(clock)
    for i in range(30):  # 21 admitted within the second; the rest deferred with reservations
        with contextlib.suppress(CapacityReserved):
            g.reserve(f"rt-{i}", calls=1)
    assert g.snapshot().reservations == 9
    # Nobody comes back, and no request arrives: at the next scrape they are gone.
    clock.now += g.schedule.reservation_grace + 2.0
    assert (g.snapshot().reservations, g.snapshot().shift_seconds) == (0, 0.0)


async def test_first_calls_the_slots_cannot_serve_in_time_leave_at_once_keeping_their_place() -> (
    None
):
    clock = Clock()
    # One slot, a call waits at most 2 s for it; admitted at the first guess of 0.1 s a call.
    g = limiter(clock, max_concurrency=1, queue_timeout=1.0)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:  # a call outside any request, on the slot
        holding.set()
        await release.wait()
        clock.now += 1.0  # it took 1 s: the estimate becomes 0.28 s a call

    served: list[str] = []

    async def request(key: str) -> None:
        reservation = g.reserve(key, calls=2)

        async def register() -> None:
            served.append(key)

        try:
            await g.call(register, reservation=reservation, then=1)
        finally:
            g.finish(reservation)  # as the token path does once its request is answered

    holder = asyncio.create_task(g.call(hold))
    await holding.wait()
    tasks = {key: asyncio.create_task(request(key)) for key in ("a", "b", "c", "d")}
    await until(lambda: g.snapshot().waiting == 4)
    release.set()
    await holder
    # At 0.28 s a call, a and b (4 calls) are served within 2 s of their wait; c and d would
    # wait longer. They leave now, not after 2 s, each with a reservation right after the
    # queue that stays, in their order: c after a and b's 4 calls, d after c's 2.
    for key in ("c", "d"):
        with pytest.raises(CapacityReserved) as info:
            await tasks[key]
        # Compass is not failing: a deferral's answer, not compass-unavailable (which writes a
        # failure condition and a Warning Event per request).
        assert (info.value.slug, info.value.spread) == ("capacity-booked", False)
    await asyncio.gather(tasks["a"], tasks["b"])
    assert served == ["a", "b"]
    spacing = 0.1 + 0.2 * (1.0 - 0.1)  # the estimate after the 1 s call, its fastest too
    starts = {k: r.start for k, r in g.schedule._reservations.items()}
    assert starts == pytest.approx({"c": 101.0 + 4 * spacing, "d": 101.0 + 6 * spacing})
    assert g.snapshot().slot_timeouts == 2
    assert g.snapshot().waiting == 0
    # Back at its reservation, c is admitted on it: nothing reserved twice.
    clock.now = starts["c"]
    g.reserve("c", calls=2)
    assert g.schedule.reservations() == 1


async def test_a_request_that_would_not_surely_end_by_its_deadline_leaves_the_queue() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=10.0)  # no slot timeout in sight
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 1.0  # 0.28 s a call on average now, the slowest recent call 1 s

    async def request(key: str) -> None:
        reservation = g.reserve(key, calls=2, deadline=103.0)

        async def register() -> None:
            return None

        await g.call(register, reservation=reservation, then=1)

    holder = asyncio.create_task(g.call(hold))
    await holding.wait()
    tasks = {key: asyncio.create_task(request(key)) for key in ("a", "b")}
    await until(lambda: g.snapshot().waiting == 2)
    release.set()
    await holder
    await tasks["a"]  # its two calls end by 103 even at the slowest call: 101 + 2 x 1 s
    # b's slot comes at 101.56: its calls end at 102.12 on the average, 103.56 at the slowest.
    # Kept on the average and then late, it would leave the queue empty later; it leaves now.
    with pytest.raises(CapacityReserved):
        await tasks["b"]


async def test_as_many_waiters_as_slots_stay_whatever_their_deadline() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=2, queue_timeout=10.0)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 1.0

    async def request(key: str) -> str:
        reservation = g.reserve(key, calls=2, deadline=101.5)  # none of them can end by then

        async def register() -> str:
            return key

        return await g.call(register, reservation=reservation, then=1)

    holders = [asyncio.create_task(g.call(hold)) for _ in range(2)]
    await holding.wait()
    await until(lambda: g.snapshot().in_flight == 2)
    tasks = {key: asyncio.create_task(request(key)) for key in ("a", "b", "c")}
    await until(lambda: g.snapshot().waiting == 3)
    release.set()
    await asyncio.gather(*holders)
    # One call for each slot stays: it keeps Director busy while those sent away come back
    # (a late request only has its token held back, its registration done).
    assert await tasks["a"] == "a"
    assert await tasks["b"] == "b"
    with pytest.raises(CapacityReserved):
        await tasks["c"]


async def test_a_follow_up_is_not_sent_out_of_the_queue() -> None:
    clock = Clock()
    g = limiter(clock, max_concurrency=1, queue_timeout=1.0)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 1.0

    async def token() -> str:
        return "token"

    async def request() -> str:
        # Its deadline is too near for two calls at the estimate to come: a first call would
        # leave the queue. The token of a request that registered goes first anyway, and is
        # held to the deadline when it has a slot (`_refuse_if_late`, with a caller to ask).
        reservation = g.reserve("rt", calls=2, deadline=clock.now + 0.5)
        return await g.call(token, reservation=reservation, follow_up=True)

    holder = asyncio.create_task(g.call(hold))
    await holding.wait()
    task = asyncio.create_task(request())
    await until(lambda: g.snapshot().waiting == 1)
    release.set()
    await holder
    assert await task == "token"
    assert g.snapshot().slot_timeouts == 0


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "control_plane_broker.overload.director_limiter"
        and r.levelno == logging.WARNING
    ]


def _breaker_limiter(clock: Clock) -> DirectorLimiter:
    return DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=3, open_seconds=5),
        max_concurrency=4,
        queue_timeout=1.0,
        clock=clock,
    )


async def _outcome(g: DirectorLimiter, fn: Callable[[], Awaitable[object]]) -> str:
    try:
        await g.call(fn)
    except CompassUnavailable as exc:
        return type(exc).__name__
    return "ok"


async def test_a_burst_of_failures_warns_once_when_the_breaker_opens_and_once_when_it_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="control_plane_broker.overload.director_limiter")
    clock = Clock()
    g = _breaker_limiter(clock)

    async def failing() -> None:
        raise DirectorRetryable("registerRuntime: HTTP 503: upstream connect error")

    async def fine() -> None:
        return None

    # 20 failing calls: the third opens the breaker, the others are refused without a call.
    outcomes = [await _outcome(g, failing) for _ in range(20)]
    assert outcomes.count("DirectorRetryable") == 3
    [opened] = _warnings(caplog)
    assert opened.getMessage().startswith("circuit breaker opened")
    assert (opened.breaker, opened.failures, opened.error) == ("open", 3, "DirectorRetryable")  # type: ignore[attr-defined]
    assert opened.cause == "registerRuntime: HTTP 503: upstream connect error"  # type: ignore[attr-defined]
    # The probe after the open period fails: the breaker opens again, told at DEBUG only.
    clock.now += 5.0
    assert await _outcome(g, failing) == "DirectorRetryable"
    assert len(_warnings(caplog)) == 1
    # The next probe passes: one line that it closed, none for the calls after it.
    clock.now += 5.0
    assert [await _outcome(g, fine) for _ in range(5)] == ["ok"] * 5
    opened_again, closed = _warnings(caplog)
    assert opened_again is opened
    assert closed.getMessage().startswith("circuit breaker closed")
    assert (closed.breaker, closed.open_seconds) == ("closed", 10.0)  # type: ignore[attr-defined]


async def test_director_unreachable_and_reachable_again_are_told_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="control_plane_broker.overload.director_limiter")
    clock = Clock()
    g = _breaker_limiter(clock)
    refused = httpx.ConnectError("[Errno 111] Connection refused")

    async def unreachable() -> None:
        raise DirectorRetryable("registerRuntime: ConnectError: Connection refused") from refused

    async def fine() -> None:
        return None

    for _ in range(10):
        await _outcome(g, unreachable)
    clock.now += 5.0
    await _outcome(g, unreachable)  # a probe that does not reach Director either
    lines = [(r.getMessage().split(":")[0], getattr(r, "error", None)) for r in _warnings(caplog)]
    assert lines == [
        ("Director unreachable", "DirectorRetryable"),
        ("circuit breaker opened", "DirectorRetryable"),
    ]
    clock.now += 5.0
    for _ in range(3):
        await _outcome(g, fine)
    lines = [r.getMessage().split(":")[0] for r in _warnings(caplog)]
    assert lines[2:] == ["Director reachable again", "circuit breaker closed"]
    assert _warnings(caplog)[2].unreachable_seconds == 10.0  # type: ignore[attr-defined]


async def test_a_timeout_now_and_then_or_failing_answers_are_not_director_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="control_plane_broker.overload.director_limiter")
    clock = Clock()
    g = _breaker_limiter(clock)
    timeout = httpx.ReadTimeout("timed out")

    async def timed_out() -> None:
        raise DirectorRetryable("requestOneTimeTokenForRuntime: ReadTimeout") from timeout

    async def fine() -> None:
        return None

    async def answered_503() -> None:
        raise DirectorRetryable("registerRuntime: HTTP 503")

    for _ in range(5):  # one timeout among answers: no transition
        await _outcome(g, timed_out)
        await _outcome(g, fine)
    assert _warnings(caplog) == []
    for _ in range(3):  # Director answers, with errors: the breaker opens, Director is reachable
        await _outcome(g, answered_503)
    assert [r.getMessage().split(":")[0] for r in _warnings(caplog)] == ["circuit breaker opened"]
