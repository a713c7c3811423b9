"""The limiter's decision on plain data (`overload/reservations.decide`): admit, defer or refuse
a request of k Director calls, with no event loop and no clock but the numbers given."""

from __future__ import annotations

import pytest

from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.capacity_schedule import CapacitySchedule
from control_plane_broker.overload.reservations import Admit, Defer, Refuse, decide
from control_plane_broker.overload.retry_after import reservation_wait

POLICY = cb.BreakerPolicy(failure_threshold=1, open_seconds=30)
CLOSED = cb.Breaker()
OPENED_AT_100 = cb.Breaker(state=cb.State.OPEN, failures=1, opened_at=100.0)


def schedule() -> CapacitySchedule:
    # 0.125 s a call on 1 slot (exact in binary): 8 calls are a second of Director's time
    return CapacitySchedule(capacity=1, max_wait=1.0, latency=0.125)


@pytest.mark.parametrize(
    ("breaker", "now", "queued", "deadline", "expected"),
    [
        # Nothing in front, Director closed: queue now.
        (CLOSED, 100.0, 0, None, Admit()),
        # 7 calls in front (0.875 s) and 2 of its own end within a second: queue now.
        (CLOSED, 100.0, 7, None, Admit()),
        # 9 in front start it 1.125 s on, beyond the 1 s promise: told to come back then,
        # early by what the agent's jitter adds (`reservation_wait`).
        (CLOSED, 100.0, 9, None, Defer(retry_after=reservation_wait(1.125, max_wait=1.0))),
        # In time by the queue, but its two calls end at 100.25, after its caller stops waiting.
        (CLOSED, 100.0, 0, 100.2, Defer(retry_after=reservation_wait(0.0, max_wait=1.0))),
        # The breaker is open until 130: refused, with a reservation after the probe.
        (OPENED_AT_100, 110.0, 0, None, Refuse(retry_after=reservation_wait(20.0, max_wait=1.0))),
        # Its open period is over: the next call is the probe, and asking does not take it.
        (OPENED_AT_100, 130.0, 0, None, Admit()),
    ],
)
def test_the_decision_admits_defers_or_refuses_by_the_numbers(
    breaker: cb.Breaker,
    now: float,
    queued: int,
    deadline: float | None,
    expected: Admit | Defer | Refuse,
) -> None:
    decision = decide(
        schedule(),
        breaker,
        POLICY,
        key="rt-1",
        calls=2,
        now=now,
        queued_calls=queued,
        deadline=deadline,
    )
    assert decision == expected


def test_a_refused_fleet_is_spread_over_reservations_after_the_probe() -> None:
    booked = schedule()
    waits = [
        decide(booked, OPENED_AT_100, POLICY, key=f"rt-{i}", calls=2, now=110.0, queued_calls=0)
        for i in range(3)
    ]
    # Each runtime's two calls after the one before it, starting at the probe (20 s on).
    assert waits == [
        Refuse(retry_after=reservation_wait(20.0 + i * 0.25, max_wait=1.0)) for i in range(3)
    ]
    assert booked.reservations() == 3
    # Back at its reservation once Director is closed again: admitted on it, nothing reserved
    # twice.
    assert decide(booked, CLOSED, POLICY, key="rt-1", calls=2, now=130.25, queued_calls=0) == (
        Admit()
    )
    assert booked.reservations() == 2
