"""The concurrency limit on Director calls, follow-ups first (`overload/priority_slots`)."""

from __future__ import annotations

import asyncio

import pytest

from control_plane_broker.overload.priority_slots import FIRST_CALL, FOLLOW_UP, PrioritySlots
from tests.unit.broker.conditions import until


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


async def test_a_refused_waiter_raises_its_error_and_its_place_goes_to_the_next() -> None:
    slots: PrioritySlots[str] = PrioritySlots(1)
    await slots.acquire(FIRST_CALL, 1.0)
    first = asyncio.create_task(slots.acquire(FIRST_CALL, 5.0, "first"))
    await until(lambda: slots.waiting == 1)
    follow = asyncio.create_task(slots.acquire(FOLLOW_UP, 5.0, "follow-up"))
    second = asyncio.create_task(slots.acquire(FIRST_CALL, 5.0, "second"))
    await until(lambda: slots.waiting == 3)
    assert [w.tag for w in slots.queue()] == ["follow-up", "first", "second"]  # service order
    slots.refuse(slots.queue()[1], LookupError("sent away"))
    with pytest.raises(LookupError, match="sent away"):
        await first
    assert (slots.waiting, [w.tag for w in slots.queue()]) == (2, ["follow-up", "second"])
    slots.release()
    await follow  # the slot goes on as if the refused waiter had never been there
    slots.release()
    await second
    assert slots.taken == 1
    slots.release()
    assert (slots.taken, slots.waiting) == (0, 0)
