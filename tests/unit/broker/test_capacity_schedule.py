"""Director's capacity schedule (`overload/capacity_schedule`): reservations, pure."""

from __future__ import annotations

import pytest

from control_plane_broker.overload.capacity_schedule import (
    Admit,
    CapacitySchedule,
    Deferred,
)


def schedule(**kwargs: float) -> CapacitySchedule:
    # 2 slots, 0.125 s a call: 1/16 s of capacity per call (exact in binary).
    return CapacitySchedule(**({"capacity": 2, "max_wait": 1.0, "latency": 0.125} | kwargs))  # type: ignore[arg-type]


SLOT = 1 / 16


def test_requests_queue_now_while_their_reservation_is_within_max_wait() -> None:
    cal = schedule()
    verdicts = [cal.reserve(f"rt-{i}", calls=1, now=0.0) for i in range(17)]
    # starts 0, 1/16, ..., 1.0: the 17th waits exactly max_wait and is still admitted
    assert verdicts == [Admit()] * 17
    assert cal.reserved_until == 17 * SLOT
    assert cal.reservations() == 0
    late = cal.reserve("rt-17", calls=1, now=0.0)
    assert late == Deferred(wait=17 * SLOT)  # the time until its reservation, no more
    assert cal.reservations() == 1


def test_a_request_of_two_calls_reserves_twice_the_capacity() -> None:
    cal = schedule()
    assert cal.reserve("a", calls=2, now=0.0) == Admit()
    assert cal.reserved_until == 2 * SLOT
    assert cal.reserve("b", calls=1, now=0.0) == Admit()
    assert cal.reserved_until == 3 * SLOT


def test_deferred_requests_are_told_their_own_reservations_spread_over_the_capacity() -> None:
    cal = schedule(max_wait=0.0)
    assert cal.reserve("first", calls=1, now=10.0) == Admit()
    waits = [cal.reserve(f"rt-{i}", calls=1, now=10.0) for i in range(4)]
    assert waits == [Deferred(wait=n * SLOT) for n in (1, 2, 3, 4)]


def test_an_idle_director_admits_at_once_whatever_was_reserved_long_ago() -> None:
    cal = schedule()
    for i in range(17):
        cal.reserve(f"rt-{i}", calls=1, now=0.0)
    assert cal.reserve("later", calls=1, now=100.0) == Admit()
    assert cal.reserved_until == 100.0 + SLOT


def deferred(**kwargs: float) -> tuple[CapacitySchedule, float]:
    """A schedule where `late` was deferred to its reservation (2 s ahead), which is returned."""
    cal = schedule(**kwargs)
    verdict = cal.reserve("late", calls=1, now=0.0, queued_calls=32)
    assert verdict == Deferred(wait=2.0)
    assert cal.reservations() == 1
    return cal, verdict.wait


def test_a_reservation_is_honoured_when_the_agent_comes_back() -> None:
    cal, start = deferred()
    reserved = cal.reserved_until
    # Too early: told the same reservation again, and nothing is reserved twice.
    assert cal.reserve("late", calls=1, now=0.5) == Deferred(wait=start - 0.5)
    assert cal.reserved_until == reserved
    # Back within max_wait of its reservation: admitted on the capacity kept for it.
    assert cal.reserve("late", calls=1, now=start - 1.0) == Admit()
    assert cal.reserved_until == reserved
    assert cal.reservations() == 0
    # The reservation is used up: the next request of that runtime reserves anew.
    cal.reserve("late", calls=1, now=start - 1.0)
    assert cal.reserved_until == reserved + SLOT


def test_a_reservation_is_honoured_until_it_expires() -> None:
    cal, start = deferred(reservation_grace=60.0)
    reserved = cal.reserved_until
    assert cal.reserve("late", calls=1, now=start + 59.0) == Admit()
    assert cal.reserved_until == reserved  # on the reservation, not a new one


def test_an_expired_reservation_is_forgotten_and_the_request_reserves_anew() -> None:
    cal, start = deferred(reservation_grace=60.0)
    now = start + 61.0
    # Booked like a new request: Director is idle by now, so admitted at once.
    assert cal.reserve("late", calls=1, now=now) == Admit()
    assert cal.reserved_until == now + SLOT
    assert cal.reservations() == 0


def test_while_director_is_down_a_reservation_keeps_its_place_until_its_reservation() -> None:
    cal = schedule()
    assert cal.reserve("a", calls=1, now=0.0, not_before=30.0) == Deferred(wait=30.0)
    reserved = cal.reserved_until
    # Back early, within max_wait of its reservation, Director still down: the same
    # reservation, not a new one behind everybody who asked meanwhile.
    assert cal.reserve("a", calls=1, now=29.5, not_before=35.0) == Deferred(wait=0.5)
    assert cal.reserved_until == reserved
    # Its start has passed and Director is still down: reserved after the next probe.
    assert cal.reserve("a", calls=1, now=30.5, not_before=35.0) == Deferred(wait=4.5)


def test_the_queue_in_front_of_director_counts_even_when_nothing_is_reserved() -> None:
    cal = schedule()
    # After a restart the schedule is empty, but 80 calls already wait for a slot: 5 s.
    assert cal.reserve("a", calls=1, now=50.0, queued_calls=80) == Deferred(wait=5.0)
    # and what it reserved is behind that queue, also for a request that sees a shorter one
    assert cal.reserve("b", calls=1, now=50.0, queued_calls=10) == Deferred(wait=5.0 + SLOT)


def test_latency_estimate_follows_measurements_smoothly_and_bounded() -> None:
    cal = schedule(smoothing=0.2, max_latency=30.0)
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


def test_reservations_of_agents_that_never_came_back_are_dropped() -> None:
    cal = CapacitySchedule(capacity=1, max_wait=0.0, latency=0.1, reservation_grace=1.0)
    cal.reserve("first", calls=1, now=0.0)
    for i in range(5119):
        assert isinstance(cal.reserve(f"gone-{i}", calls=1, now=0.0), Deferred)
    assert cal.reservations() == 5119
    # Much later a new herd arrives; the stale reservations go when the schedule grows again.
    cal.reserve("new", calls=1, now=1e6, queued_calls=10)
    assert cal.reservations() == 1


def test_expiry_drops_the_oldest_reservations_and_stops_at_the_first_still_valid() -> None:
    cal = CapacitySchedule(capacity=1, max_wait=0.0, latency=1.0, reservation_grace=10.0)
    cal.reserve("first", calls=1, now=0.0)
    for i in range(3):  # starts 1, 2, 3: they expire at 11, 12, 13
        assert cal.reserve(f"rt-{i}", calls=1, now=0.0) == Deferred(wait=1.0 + i)
    cal.expire(11.5)
    assert cal.reservations() == 2
    cal.expire(13.0)  # rt-2 is valid until the end of 13
    assert cal.reservations() == 1
    # A reserve expires too, before it looks at its own key: rt-2, late, reserves anew.
    assert cal.reserve("rt-2", calls=1, now=13.5) == Admit()
    assert cal.reservations() == 0


def test_a_reservation_waits_while_director_is_behind_the_schedule() -> None:
    cal, start = deferred()
    reserved = cal.reserved_until
    # Back at its reservation, but 48 calls (3 s) wait in front of Director, 2 s more than max_wait:
    # admitted now it would wait longer than promised. Told to come back when it would not,
    # that very time (not aimed early: it would find the queue as long).
    assert cal.reserve("late", calls=1, now=start, queued_calls=48) == Deferred(
        wait=2.0, aim_early=False
    )
    assert cal.reservations() == 1
    # Back then, with the queue down to max_wait: admitted on its reservation, nothing
    # reserved twice (what is reserved after it moved back with it).
    assert cal.reserve("late", calls=1, now=start + 2.0, queued_calls=16) == Admit()
    assert cal.reservations() == 0
    assert cal.reserved_until == reserved + 2.0


def test_when_director_falls_behind_every_later_wait_moves_back_in_order() -> None:
    cal = schedule()  # 1/16 s a call, max_wait 1 s
    # A fleet deferred while 32 calls (2 s) queued: starts at 2, 2 + 1/16, ... in order.
    for i in range(20):
        assert cal.reserve(f"rt-{i}", calls=1, now=0.0, queued_calls=32) == Deferred(
            wait=2.0 + i * SLOT
        )
    reserved = cal.reserved_until
    # Director served slower than reserved: rt-0 comes back at its reservation to a queue 2 s
    # past the promise. Its start and every later one move back by those 2 s.
    assert cal.reserve("rt-0", calls=1, now=2.0, queued_calls=48) == Deferred(
        wait=2.0, aim_early=False
    )
    assert cal.shift == 2.0
    assert cal.reserved_until == reserved + 2.0
    # rt-5, back at its old start, is told its moved start (not sent away for a second to ask
    # again while the queue stays long), still after rt-0's.
    assert cal.reserve("rt-5", calls=1, now=2.0 + 5 * SLOT, queued_calls=40) == Deferred(wait=2.0)
    # A newcomer reserves after the moved reservations, not between them.
    assert cal.reserve("new", calls=1, now=2.5, queued_calls=40) == Deferred(
        wait=reserved + 2.0 - 2.5
    )
    # At their moved starts, with the queue back within the promise, they are admitted.
    assert cal.reserve("rt-0", calls=1, now=4.0, queued_calls=16) == Admit()
    assert cal.reserve("rt-5", calls=1, now=4.0 + 5 * SLOT, queued_calls=16) == Admit()
    # The others never come back: a grace after their (moved) starts they are gone, and with
    # no reservation left to keep in order the next herd starts afresh.
    cal.expire(reserved + 2.0 + cal.reservation_grace + 0.1)
    assert (cal.reservations(), cal.shift) == (0, 0.0)


def slowed_by_a_burst() -> CapacitySchedule:
    cal = schedule()  # 2 slots, 0.125 s a call
    for _ in range(32):
        cal.observe(0.125)
    for _ in range(3):  # a burst slowed the broker's loop: three calls looked eight times slower
        cal.observe(1.0)
    assert cal.latency > 0.5
    return cal


def test_reservations_far_ahead_are_srated_at_the_rate_of_the_fastest_recent_call() -> None:
    cal = slowed_by_a_burst()
    # Admission is judged at the average: 4 calls in front are more than max_wait (1 s) by it,
    # so the request is deferred, which the fastest pace alone would not have done ...
    assert 4 * cal.seconds_per_call() > 1.0 > 4 * SLOT
    # ... but its reservation, and the reservations after it, follow at the fastest recent
    # pace, 1/16 s a call: one placed late would leave Director idle until its agent is back.
    assert cal.reserve("queued-behind", calls=1, now=0.0, queued_calls=4) == Deferred(wait=4 * SLOT)
    waits = [cal.reserve(f"rt-{i}", calls=2, now=0.0, queued_calls=4) for i in range(3)]
    assert waits == [Deferred(wait=5 * SLOT + 2 * i * SLOT) for i in range(3)]
    # Once the slow calls are older than the last 32, the average is the pace again.
    for _ in range(32):
        cal.observe(2.0)
    assert cal.seconds_per_call_ahead() == cal.seconds_per_call()


def test_what_a_request_queued_now_reserves_is_counted_at_the_fastest_recent_rate() -> None:
    cal = slowed_by_a_burst()
    # Nothing queued: admitted, though the average prices each call far above 1/16 s ...
    assert cal.seconds_per_call() > 4 * SLOT
    assert cal.reserve("admitted", calls=2, now=0.0) == Admit()
    # ... and it holds Director for two calls at the pace Director showed, so the first
    # deferred reservation starts right behind it, not where the inflated average would put it.
    assert cal.reserved_until == 2 * SLOT
    assert cal.reserve("deferred", calls=1, now=0.0, queued_calls=4) == Deferred(wait=4 * SLOT)


def test_a_new_request_queues_now_only_when_its_wait_and_calls_end_before_its_deadline() -> None:
    cal = schedule()
    for i in range(8):  # 8 calls ahead: the next one starts 0.5 s from now
        assert cal.reserve(f"rt-{i}", calls=1, now=0.0) == Admit()
    # 0.5 s wait + 2 calls of 0.125 s end at 0.75 s: within a deadline at 0.75.
    assert cal.reserve("in-time", calls=2, now=0.0, deadline=0.75) == Admit()
    # The next waits 0.625 s and its calls end at 0.875 s: past 0.85, though its wait is within
    # max_wait (the request spent the rest of its time in the broker before it asked).
    late = cal.reserve("late", calls=2, now=0.0, deadline=0.85)
    assert late == Deferred(wait=10 * SLOT)  # after everything reserved, as any deferral
    assert cal.reservations() == 1
    # At its reservation it is admitted: the wait is what was promised to it.
    assert cal.reserve("late", calls=2, now=10 * SLOT, deadline=10 * SLOT) == Admit()


def test_a_request_already_past_its_deadline_is_deferred_even_with_director_idle() -> None:
    cal = schedule()
    verdict = cal.reserve("slow-front", calls=1, now=5.0, deadline=4.0)
    assert verdict == Deferred(wait=0.0)
    assert cal.reservations() == 1
    assert cal.reserve("no-deadline", calls=1, now=5.0) == Admit()


def test_a_request_sent_out_of_the_queue_keeps_its_place_before_later_reservations() -> None:
    cal = schedule()  # 1/16 s a call, max_wait 1 s
    # Admitted while 8 calls (0.5 s) queued; then 24 more queued (2 s) and a newcomer got a
    # reservation after them.
    assert cal.reserve("admitted", calls=1, now=0.0, queued_calls=8) == Admit()
    assert cal.reserve("later", calls=1, now=0.0, queued_calls=32) == Deferred(wait=2.0)
    reserved = cal.reserved_until
    # Director turned slow: the admitted request leaves the queue, 8 calls staying in front
    # of it. Its place is right after them, before the newcomer's, not after the last one.
    assert cal.hold_place("admitted", calls=1, now=0.0, queued_calls=8) == Deferred(wait=0.5)
    assert cal.reserved_until == reserved
    assert cal.reserve("admitted", calls=1, now=0.5, queued_calls=8) == Admit()
    assert cal.reservations() == 1


def test_reservations_expire_at_their_own_time_in_whatever_order_they_were_made() -> None:
    cal = schedule()
    assert cal.reserve("later", calls=1, now=0.0, queued_calls=32) == Deferred(wait=2.0)
    assert cal.hold_place("earlier", calls=1, now=0.0, queued_calls=8) == Deferred(wait=0.5)
    # "earlier" was made after "later" but starts before it: it expires first.
    cal.expire(0.5 + cal.reservation_grace + 0.01)
    assert list(cal._reservations) == ["later"]
    cal.expire(2.0 + cal.reservation_grace + 0.01)
    assert cal.reservations() == 0


def test_reservations_made_again_and_again_keep_the_expiry_heap_bounded() -> None:
    cal = schedule()
    for i in range(10_000):
        cal.hold_place(f"rt-{i % 3}", calls=1, now=float(i), queued_calls=1)
    assert cal.reservations() == 3
    assert len(cal._expiry) <= 2 * 3 + 64 + 1


def test_whether_a_call_surely_ends_in_time_is_judged_at_the_slowest_recent_call() -> None:
    cal = schedule()
    assert cal.slowest_recent_call() == 0.125  # nothing measured: the first guess
    for seconds in (3.0, 5.0, 4.0):
        cal.observe(seconds)
    assert cal.slowest_recent_call() == 5.0
    for _ in range(cal.recent_calls):
        cal.observe(0.01)
    assert cal.slowest_recent_call() == cal.latency  # never faster than the average
