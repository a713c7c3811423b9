"""Admission to Director's capacity: the booking calendar (pure), the priority slots and the
guard that puts them in front of every Director call."""

from __future__ import annotations

import asyncio

import pytest

from control_plane_broker.director.classification import DirectorRetryable
from control_plane_broker.errors import CompassUnavailable, TurnBooked
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import (
    Admissions,
    Admitted,
    Calendar,
    Deferred,
    advise,
)
from control_plane_broker.overload.director_limiter import (
    FIRST_CALL,
    FOLLOW_UP,
    DirectorGuard,
    PrioritySlots,
)
from tests.unit.broker.conditions import until

# --- the calendar ----------------------------------------------------------------------------


def calendar(**kwargs: float) -> Calendar:
    # 2 slots, 0.125 s a call: 1/16 s of capacity per call (exact in binary).
    return Calendar(**({"capacity": 2, "max_wait": 1.0, "latency": 0.125} | kwargs))  # type: ignore[arg-type]


SLOT = 1 / 16


def test_requests_are_admitted_while_their_turn_is_within_max_wait() -> None:
    cal = calendar()
    verdicts = [cal.book(f"rt-{i}", calls=1, now=0.0) for i in range(17)]
    # turns 0, 1/16, ..., 1.0: the 17th waits exactly max_wait and is still admitted
    assert verdicts == [Admitted()] * 17
    assert cal.booked_until == 17 * SLOT
    assert cal.tickets() == 0
    late = cal.book("rt-17", calls=1, now=0.0)
    assert late == Deferred(retry_after=17 * SLOT)  # the time until its turn, no more
    assert cal.tickets() == 1


def test_a_request_of_two_calls_books_twice_the_capacity() -> None:
    cal = calendar()
    assert cal.book("a", calls=2, now=0.0) == Admitted()
    assert cal.booked_until == 2 * SLOT
    assert cal.book("b", calls=1, now=0.0) == Admitted()
    assert cal.booked_until == 3 * SLOT


def test_deferred_requests_are_told_their_own_turns_spread_over_the_capacity() -> None:
    cal = calendar(max_wait=0.0)
    assert cal.book("first", calls=1, now=10.0) == Admitted()
    waits = [cal.book(f"rt-{i}", calls=1, now=10.0) for i in range(4)]
    assert waits == [Deferred(retry_after=n * SLOT) for n in (1, 2, 3, 4)]


def test_an_idle_director_admits_at_once_whatever_was_booked_long_ago() -> None:
    cal = calendar()
    for i in range(17):
        cal.book(f"rt-{i}", calls=1, now=0.0)
    assert cal.book("later", calls=1, now=100.0) == Admitted()
    assert cal.booked_until == 100.0 + SLOT


def deferred(**kwargs: float) -> tuple[Calendar, float]:
    """A calendar where `late` was deferred to its turn (2 s ahead), which is returned."""
    cal = calendar(**kwargs)
    verdict = cal.book("late", calls=1, now=0.0, queued_calls=32)
    assert verdict == Deferred(retry_after=2.0)
    assert cal.tickets() == 1
    return cal, verdict.retry_after


def test_a_ticket_is_honoured_when_the_agent_comes_back() -> None:
    cal, turn = deferred()
    booked = cal.booked_until
    # Too early: told the same turn again, and nothing is booked twice.
    assert cal.book("late", calls=1, now=0.5) == Deferred(retry_after=turn - 0.5)
    assert cal.booked_until == booked
    # Back within max_wait of its turn: admitted on the capacity kept for it.
    assert cal.book("late", calls=1, now=turn - 1.0) == Admitted()
    assert cal.booked_until == booked
    assert cal.tickets() == 0
    # The ticket is used up: the next request of that runtime books anew.
    cal.book("late", calls=1, now=turn - 1.0)
    assert cal.booked_until == booked + SLOT


def test_a_ticket_is_honoured_until_it_expires() -> None:
    cal, turn = deferred(ticket_grace=60.0)
    booked = cal.booked_until
    assert cal.book("late", calls=1, now=turn + 59.0) == Admitted()
    assert cal.booked_until == booked  # on the ticket, not a new booking


def test_an_expired_ticket_is_forgotten_and_the_request_books_anew() -> None:
    cal, turn = deferred(ticket_grace=60.0)
    now = turn + 61.0
    # Booked like a new request: Director is idle by now, so admitted at once.
    assert cal.book("late", calls=1, now=now) == Admitted()
    assert cal.booked_until == now + SLOT
    assert cal.tickets() == 0


def test_while_director_is_down_a_ticket_keeps_its_place_until_its_turn() -> None:
    cal = calendar()
    assert cal.book("a", calls=1, now=0.0, not_before=30.0) == Deferred(retry_after=30.0)
    booked = cal.booked_until
    # Back early, within max_wait of its turn, Director still down: the same turn, not a new
    # one behind everybody who asked meanwhile.
    assert cal.book("a", calls=1, now=29.5, not_before=35.0) == Deferred(retry_after=0.5)
    assert cal.booked_until == booked
    # Its turn has passed and Director is still down: booked after the next probe.
    assert cal.book("a", calls=1, now=30.5, not_before=35.0) == Deferred(retry_after=4.5)


def test_cancel_gives_the_ticket_up() -> None:
    cal = calendar(max_wait=0.0)
    cal.book("a", calls=1, now=0.0)
    assert isinstance(cal.book("b", calls=1, now=0.0), Deferred)
    cal.cancel("b")
    cal.cancel("never-booked")
    assert cal.tickets() == 0


def test_the_queue_in_front_of_director_counts_even_when_nothing_is_booked() -> None:
    cal = calendar()
    # After a restart the calendar is empty, but 80 calls already wait for a slot: 5 s.
    assert cal.book("a", calls=1, now=50.0, queued_calls=80) == Deferred(retry_after=5.0)
    # and what it booked is behind that queue, also for a request that sees a shorter one
    assert cal.book("b", calls=1, now=50.0, queued_calls=10) == Deferred(retry_after=5.0 + SLOT)


@pytest.mark.parametrize(
    ("wait", "max_wait", "told"),
    [
        (0.2, 10.0, 1.0),  # never less than the header's second
        (5.0, 10.0, 1.0),  # a second of jitter, aimed 2.5 s (max_wait / 4) early: 1.5, whole
        (9.0, 10.0, 5.0),  # 8 + a second of jitter is its turn; aimed 2.5 s before: 5.5
        (33.0, 10.0, 27.0),  # a tenth: 30 + 3 is its turn at the latest; 27.5 aims 2.5 s early
        (125.0, 10.0, 115.0),  # not more than max_wait early: it would be sent away again
        (33.0, 4.0, 29.0),  # a smaller waiting room: aimed a second early, 29 at the earliest
        (33.0, 0.0, 33.0),  # no waiting room: exactly its turn
    ],
)
def test_agents_are_told_a_time_that_gets_them_there_by_their_turn(
    wait: float, max_wait: float, told: float
) -> None:
    assert advise(wait, max_wait=max_wait) == told


def test_latency_estimate_follows_measurements_smoothly_and_bounded() -> None:
    cal = calendar(smoothing=0.2, max_latency=30.0)
    cal.observe(1.125)
    assert cal.latency == pytest.approx(0.125 + 0.2 * 1.0)
    assert cal.seconds_per_call() == pytest.approx(0.325 / 2)
    cal.observe(-5.0)  # a clock step backwards counts as instant, not negative
    assert cal.latency == pytest.approx(0.325 * 0.8)
    cal.observe(3600.0)  # a hung call: bounded
    assert cal.latency == pytest.approx(0.26 + 0.2 * (30.0 - 0.26))
    for _ in range(100):
        cal.observe(0.5)
    assert cal.latency == pytest.approx(0.5)


def test_tickets_of_agents_that_never_came_back_are_dropped() -> None:
    cal = Calendar(capacity=1, max_wait=0.0, latency=0.1, ticket_grace=1.0)
    cal.book("first", calls=1, now=0.0)
    for i in range(5119):
        assert isinstance(cal.book(f"gone-{i}", calls=1, now=0.0), Deferred)
    assert cal.tickets() == 5119
    # Much later a new herd arrives; the stale tickets go when the book grows again.
    cal.book("new", calls=1, now=1e6, queued_calls=10)
    assert cal.tickets() == 1


# --- priority slots --------------------------------------------------------------------------


async def test_slots_serve_follow_ups_first_then_by_arrival() -> None:
    slots = PrioritySlots(1)
    await slots.acquire(FIRST_CALL, 1.0)
    served: list[str] = []

    async def worker(name: str, priority: int) -> None:
        await slots.acquire(priority, 5.0)
        served.append(name)
        slots.release()

    tasks: list[asyncio.Task[None]] = []
    arrivals = [("a", FIRST_CALL), ("f1", FOLLOW_UP), ("b", FIRST_CALL), ("f2", FOLLOW_UP)]
    for name, priority in arrivals:
        tasks.append(asyncio.create_task(worker(name, priority)))
        await until(lambda: slots.waiting == len(tasks))  # queued in this order
    slots.release()
    await asyncio.gather(*tasks)
    assert served == ["f1", "f2", "a", "b"]
    assert slots.waiting == 0


async def test_a_waiter_that_times_out_leaves_no_trace() -> None:
    slots = PrioritySlots(1)
    await slots.acquire(FIRST_CALL, 1.0)
    with pytest.raises(TimeoutError):
        await slots.acquire(FIRST_CALL, 0.01)
    assert slots.waiting == 0
    slots.release()
    # The slot came back free, not handed to the waiter that gave up.
    await slots.acquire(FIRST_CALL, 0.0)
    with pytest.raises(TimeoutError):
        await slots.acquire(FIRST_CALL, 0.0)


async def test_a_slot_granted_to_a_cancelled_waiter_is_passed_on() -> None:
    slots = PrioritySlots(1)
    await slots.acquire(FIRST_CALL, 1.0)
    got: list[str] = []

    async def waiter(name: str) -> None:
        await slots.acquire(FIRST_CALL, 5.0)
        got.append(name)

    first = asyncio.create_task(waiter("first"))
    await until(lambda: slots.waiting == 1)
    second = asyncio.create_task(waiter("second"))
    await until(lambda: slots.waiting == 2)
    first.cancel()  # cancelled, and before it can handle that ...
    slots.release()  # ... the slot is granted to it
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert got == ["second"]
    assert slots.waiting == 0
    slots.release()
    await slots.acquire(FIRST_CALL, 0.0)  # exactly one slot, free again


# --- the guard -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def guard(clock: Clock, **kwargs: float) -> DirectorGuard:
    return DirectorGuard(
        policy=cb.BreakerPolicy(failure_threshold=1, open_seconds=30),
        max_concurrency=int(kwargs.pop("max_concurrency", 2)),
        queue_timeout=kwargs.pop("queue_timeout", 1.0),
        clock=clock,
    )


def test_book_refuses_with_the_turn_and_no_jitter() -> None:
    clock = Clock()
    g = guard(clock)
    for i in range(21):
        g.book(f"rt-{i}", calls=1)
    with pytest.raises(TurnBooked) as info:
        g.book("late", calls=1)
    # its turn is 1.05 s ahead: told the whole second that gets it there by then
    assert info.value.retry_after == advise(1.05, max_wait=1.0) == 1.0
    assert (info.value.status, info.value.slug, info.value.spread) == (
        503,
        "capacity-booked",
        False,
    )
    clock.now += 1.05
    g.book("late", calls=1)  # its turn: admitted on its ticket


async def test_while_open_the_fleet_is_spread_over_turns_after_the_probe() -> None:
    clock = Clock()
    g = guard(clock)

    async def failing() -> None:
        raise DirectorRetryable("503")

    with pytest.raises(CompassUnavailable):
        await g.call(failing)
    assert g.state is cb.State.OPEN
    turns = []
    for index in range(100):
        with pytest.raises(CompassUnavailable) as info:
            g.refuse_if_open(f"rt-{index}", calls=2)
        turns.append(info.value.retry_after)
    # Nobody before the probe; then one after the other at Director's pace, not all at once
    # (each told the time that gets it there by its turn, see `advise`).
    per_runtime = 2 * g.calendar.seconds_per_call()
    assert turns == [advise(30 + i * per_runtime, max_wait=1.0) for i in range(100)]
    assert min(turns) >= 29
    # Asking again before its turn gives the same turn (no second booking).
    with pytest.raises(CompassUnavailable) as again:
        g.refuse_if_open("rt-50", calls=2)
    assert again.value.retry_after == turns[50]


async def test_refuse_if_open_is_cheap_and_does_not_take_the_probe() -> None:
    clock = Clock()
    g = guard(clock)

    async def failing() -> None:
        raise DirectorRetryable("503")

    g.refuse_if_open("rt-1", calls=1)  # closed: nothing to refuse
    with pytest.raises(CompassUnavailable):
        await g.call(failing)
    assert g.state is cb.State.OPEN
    with pytest.raises(CompassUnavailable) as info:
        g.refuse_if_open("rt-1", calls=1)
    assert info.value.retry_after == advise(30, max_wait=1.0) == 29
    assert not info.value.spread  # the turn is the spread: no random seconds on top
    clock.now += 30
    g.refuse_if_open("rt-1", calls=1)  # the probe's turn: not refused ...
    g.refuse_if_open("rt-1", calls=1)  # ... also when asked twice, since asking takes nothing

    async def probe() -> str:
        return "ok"

    assert await g.call(probe) == "ok"  # the probe was still there to take
    assert g.state is cb.State.CLOSED


async def test_a_call_outside_any_request_is_measured_from_its_slots_grant() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1)
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
    assert g.calendar.latency == pytest.approx(0.1 + 0.2 * 1.0)
    # The slot was handed over at once, but the loop resumed the waiter only after 0.4 s: the
    # slot was held (and Director idle) for that time too.
    clock.now += 0.4
    await waiter
    assert g.calendar.latency == pytest.approx(0.3 + 0.2 * (0.5 - 0.3))


# --- a request's whole use of the slots -------------------------------------------------------


def test_a_finished_request_costs_its_slot_time_per_call_it_booked() -> None:
    admissions = Admissions()
    request = admissions.admit(2)
    other = admissions.admit(1)
    assert admissions.outstanding == 3
    # Two look-ups it did not book, the registration and the token: four calls held slots.
    for seconds in (0.05, 0.05, 0.12, 0.08):
        admissions.spent(request, seconds, ok=True)
    assert admissions.finish(request) == pytest.approx(0.3 / 2)
    assert admissions.outstanding == 1
    assert admissions.finish(request) is None  # once only
    assert admissions.outstanding == 1
    assert admissions.finish(other) is None  # no call made: nothing learnt of a call's cost
    assert admissions.outstanding == 0


def test_a_request_with_a_failed_call_teaches_nothing_but_is_no_longer_outstanding() -> None:
    admissions = Admissions()
    request = admissions.admit(2)
    admissions.spent(request, 0.1, ok=True)
    admissions.spent(request, 10.0, ok=False)  # a timeout is no pace of Director's
    assert admissions.finish(request) is None
    assert admissions.outstanding == 0


def test_a_request_is_ahead_from_its_first_call_with_what_its_calls_have_not_held_yet() -> None:
    admissions = Admissions()
    request = admissions.admit(2)
    assert admissions.ahead(0.1) == 0  # admitted, still in the broker's own work
    admissions.asking(request)  # its first call asks for a slot
    assert admissions.ahead(0.1) == 2
    admissions.asking(request)  # its second: the request is in the queue once
    assert admissions.ahead(0.1) == 2
    admissions.spent(request, 0.1, ok=True)  # registered
    assert admissions.ahead(0.1) == pytest.approx(1)
    other = admissions.admit(2)
    admissions.asking(other)
    admissions.spent(request, 0.2, ok=True)  # its token took twice the price ...
    # ... which is counted against the others' calls: the price is an average.
    assert admissions.ahead(0.1) == pytest.approx(1)
    assert admissions.ahead(0.3) == pytest.approx(3)  # by a dearer price, more is left
    assert admissions.finish(request) == pytest.approx(0.15)
    assert admissions.ahead(0.1) == pytest.approx(2)  # the other's two calls, none held yet
    admissions.finish(other)
    assert (admissions.ahead(0.1), admissions.started, admissions.spent_seconds) == (0, 0, 0)
    never = admissions.admit(1)  # finished before any call asked: never in the queue
    assert admissions.finish(never) is None
    admissions.asking(never)
    assert admissions.ahead(0.1) == 0


async def test_the_calendar_learns_a_requests_slot_time_per_booked_call_when_it_ends() -> None:
    clock = Clock()
    g = guard(clock)

    async def call(seconds: float) -> None:
        async def fn() -> None:
            clock.now += seconds

        await g.call(fn)

    async def request() -> None:
        g.book("rt-1", calls=2)
        for seconds in (0.2, 0.2, 0.5, 0.3):  # two look-ups, register, token
            await call(seconds)
        assert g.calendar.latency == 0.1  # nothing learnt before the request is over

    await asyncio.create_task(request())
    await asyncio.sleep(0)  # the task's end is seen by its done callback
    assert g.calendar.latency == pytest.approx(0.1 + 0.2 * (1.2 / 2 - 0.1))


async def test_admitted_requests_count_in_the_queue_from_first_call_to_last_answer() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1, queue_timeout=1.0)  # 0.1 s a booked call, one at a time
    holding, release = asyncio.Event(), asyncio.Event()
    go, written = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 0.1

    async def call() -> None:
        clock.now += 0.1  # what the calendar prices: its estimate stays put

    async def request(key: str) -> None:
        g.book(key, calls=2)
        await go.wait()  # admitted, still in the broker's own work (its mapping written to KCP)
        await g.call(call, then=1)  # registers ...
        await g.call(call, follow_up=True)  # ... and asks for the token
        await written.wait()  # its status written to KCP, its answer not sent yet

    tasks = [asyncio.create_task(request(f"rt-{i}")) for i in range(3)]
    await until(lambda: g._admissions.outstanding == 6)
    clock.now += 1.0  # their bookings are behind: only the queue can count them now
    holder = asyncio.create_task(g.call(hold))  # a call of the reconciler's holds the slot
    await holding.wait()
    # Admitted, none of their calls asked for a slot yet: not in the queue in front of Director.
    assert g._queued_calls() == 0
    go.set()
    await until(lambda: g.snapshot().waiting == 3)
    # Their registrations wait for the slot: the six calls they booked are in front (0.6 s).
    assert g._queued_calls() == pytest.approx(6)
    # A request of 5 calls is admitted behind them (its turn 0.6 s away), the next is not.
    assert g.calendar.book("new-0", calls=5, now=clock.now, queued_calls=6) == Admitted()
    assert isinstance(g.calendar.book("new-1", calls=1, now=clock.now, queued_calls=6), Deferred)
    release.set()
    await holder
    await until(lambda: g._slots.taken == 0 and g.snapshot().waiting == 0)
    # Every booked call answered (0.6 s held), the requests still busy with KCP: nothing of
    # theirs is left in front of Director, though they have not finished.
    assert g._admissions.outstanding == 6
    assert g._queued_calls() == pytest.approx(0.0, abs=1e-9)
    written.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(0)
    assert (g._admissions.outstanding, g._admissions.started) == (0, 0)
    assert g.calendar.latency == pytest.approx(0.1)


async def test_a_task_that_books_again_has_finished_its_last_request() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1, queue_timeout=100.0)

    async def fn() -> None:
        clock.now += 0.4

    for i in range(3):
        g.book(f"rt-{i}", calls=2)
        await g.call(fn)
        assert g._admissions.outstanding == 2  # only the request it serves now
    assert g.calendar.latency == pytest.approx(0.1 + 0.2 * (0.2 - 0.1) + 0.2 * (0.2 - 0.12))


async def test_a_request_s_calls_are_not_owed_twice_nor_counted_as_unbooked() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1, queue_timeout=100.0)
    inside = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        inside.set()
        await release.wait()

    async def register() -> None:
        clock.now += 0.1

    async def request() -> None:
        g.book("rt", calls=2)
        await g.call(register, then=1)

    holder = asyncio.create_task(g.call(hold))
    await inside.wait()
    task = asyncio.create_task(request())
    await until(lambda: g.snapshot().waiting == 1)
    # the request's two booked calls; the waiting registration and its token are among them
    assert g._queued_calls() == 2
    release.set()
    await asyncio.gather(holder, task)
    await asyncio.sleep(0)
    assert g._queued_calls() == 0


async def test_a_call_that_finds_no_slot_in_twice_the_queue_timeout_is_refused() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1, queue_timeout=0.01)
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


def test_a_ticket_waits_while_director_is_behind_the_calendar() -> None:
    cal, turn = deferred()
    booked = cal.booked_until
    # Back at its turn, but 48 calls (3 s) wait in front of Director, 2 s more than max_wait:
    # admitted now it would wait longer than promised. Told to come back when it would not.
    assert cal.book("late", calls=1, now=turn, queued_calls=48) == Deferred(retry_after=2.0)
    assert cal.tickets() == 1
    # Back then, with the queue down to max_wait: admitted on its ticket, nothing booked twice
    # (what is booked after it moved back with it).
    assert cal.book("late", calls=1, now=turn + 2.0, queued_calls=16) == Admitted()
    assert cal.tickets() == 0
    assert cal.booked_until == booked + 2.0


def test_when_director_falls_behind_every_later_turn_moves_back_in_order() -> None:
    cal = calendar()  # 1/16 s a call, max_wait 1 s
    # A fleet deferred while 32 calls (2 s) queued: turns at 2, 2 + 1/16, ... in order.
    for i in range(20):
        assert cal.book(f"rt-{i}", calls=1, now=0.0, queued_calls=32) == Deferred(
            retry_after=2.0 + i * SLOT
        )
    booked = cal.booked_until
    # Director served slower than booked: rt-0 comes back at its turn to a queue 2 s past the
    # promise. Its turn and every later one move back by those 2 s.
    assert cal.book("rt-0", calls=1, now=2.0, queued_calls=48) == Deferred(retry_after=2.0)
    assert cal.shift == 2.0
    assert cal.booked_until == booked + 2.0
    # rt-5, back at its old turn, is told its moved turn (not sent away for a second to ask
    # again while the queue stays long), still after rt-0's.
    assert cal.book("rt-5", calls=1, now=2.0 + 5 * SLOT, queued_calls=40) == Deferred(
        retry_after=2.0
    )
    # A newcomer books after the moved turns, not between them.
    assert cal.book("new", calls=1, now=2.5, queued_calls=40) == Deferred(
        retry_after=booked + 2.0 - 2.5
    )
    # In their moved turns, with the queue back within the promise, they are admitted.
    assert cal.book("rt-0", calls=1, now=4.0, queued_calls=16) == Admitted()
    assert cal.book("rt-5", calls=1, now=4.0 + 5 * SLOT, queued_calls=16) == Admitted()
    for i in (*range(1, 5), *range(6, 20)):
        cal.cancel(f"rt-{i}")
    cal.cancel("new")
    assert (cal.tickets(), cal.shift) == (
        0,
        0.0,
    )  # no turn left to keep: the next herd starts afresh


async def test_the_queue_counts_the_tokens_that_waiting_registrations_will_ask_for() -> None:
    clock = Clock()
    g = guard(clock, max_concurrency=1, queue_timeout=1.0)  # 0.1 s a call, one at a time
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        holding.set()
        await release.wait()
        clock.now += 0.1  # each call takes what the calendar expects: its estimate stays put

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
    with pytest.raises(TurnBooked) as info:
        g.book("behind", calls=1)
    assert info.value.retry_after == advise(1.2, max_wait=1.0)
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
    g.book("next", calls=1)
    release.set()
    await asyncio.gather(*calls)


def slowed_by_a_burst() -> Calendar:
    cal = calendar()  # 2 slots, 0.125 s a call
    for _ in range(32):
        cal.observe(0.125)
    for _ in range(3):  # a burst slowed the broker's loop: three calls looked eight times slower
        cal.observe(1.0)
    assert cal.latency > 0.5
    return cal


def test_turns_far_ahead_are_spaced_at_the_pace_of_the_fastest_recent_call() -> None:
    cal = slowed_by_a_burst()
    # Admission is judged at the average: 4 calls in front are more than max_wait (1 s) by it,
    # so the request is deferred, which the fastest pace alone would not have done ...
    assert 4 * cal.seconds_per_call() > 1.0 > 4 * SLOT
    # ... but its turn, and the turns after it, follow at the fastest recent pace, 1/16 s a
    # call: a turn booked late would leave Director idle until its agent is back.
    assert cal.book("queued-behind", calls=1, now=0.0, queued_calls=4) == Deferred(
        retry_after=4 * SLOT
    )
    turns = [cal.book(f"rt-{i}", calls=2, now=0.0, queued_calls=4) for i in range(3)]
    assert turns == [Deferred(retry_after=5 * SLOT + 2 * i * SLOT) for i in range(3)]
    # Once the slow calls are older than the last 32, the average is the pace again.
    for _ in range(32):
        cal.observe(2.0)
    assert cal.seconds_per_call_ahead() == cal.seconds_per_call()


def test_what_an_admitted_request_books_is_counted_at_the_fastest_recent_pace() -> None:
    cal = slowed_by_a_burst()
    # Nothing queued: admitted, though the average prices each call far above 1/16 s ...
    assert cal.seconds_per_call() > 4 * SLOT
    assert cal.book("admitted", calls=2, now=0.0) == Admitted()
    # ... and it holds Director for two calls at the pace Director showed, so the first
    # deferred turn starts right behind it, not where the inflated average would put it.
    assert cal.booked_until == 2 * SLOT
    assert cal.book("deferred", calls=1, now=0.0, queued_calls=4) == Deferred(retry_after=4 * SLOT)
