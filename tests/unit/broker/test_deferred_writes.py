"""The writes no answer waits for: held while Director is busy, never longer than their delay,
in the order asked, none lost when the queue is full, all written at shutdown."""

from __future__ import annotations

import asyncio

import pytest

from control_plane_broker.overload.deferred_writes import POLL_SECONDS, DeferredWrites, hold_for


@pytest.mark.parametrize(
    ("asked_at", "now", "busy", "expected"),
    [
        (0.0, 0.0, False, 0.0),  # nothing waits for Director: at once
        (0.0, 29.0, False, 0.0),
        (0.0, 0.0, True, POLL_SECONDS),  # busy: look again soon
        (0.0, 29.9, True, pytest.approx(0.1)),  # busy, nearly due: only until it is due
        (0.0, 30.0, True, 0.0),  # due: written although Director is still busy
        (0.0, 45.0, True, 0.0),
    ],
)
def test_hold_for(asked_at: float, now: float, busy: bool, expected: float) -> None:
    assert hold_for(asked_at=asked_at, now=now, busy=busy, max_delay=30.0) == expected


class World:
    """A clock that moves only when the worker sleeps, and a switch for Director's backlog."""

    def __init__(self, **kwargs: int) -> None:
        self.now = 0.0
        self.busy = False
        self.written: list[str] = []
        self.depths: list[int] = []
        self.deferred = DeferredWrites(
            busy=lambda: self.busy,
            clock=lambda: self.now,
            sleep=self.sleep,
            max_delay=30.0,
            on_depth=self.depths.append,
            **kwargs,
        )

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    def write(self, name: str) -> bool:
        async def work() -> None:
            self.written.append(f"{name}@{self.now:g}")

        return self.deferred.defer(work)


async def settle() -> None:
    # Fewer turns than a busy worker needs to reach the delay (30 s / POLL_SECONDS each).
    for _ in range(50):
        await asyncio.sleep(0)


async def test_writes_wait_while_director_is_busy_and_run_in_order_once_it_is_not() -> None:
    w = World()
    worker = asyncio.create_task(w.deferred.run())
    w.busy = True
    assert w.write("status-a")
    assert w.write("event-a")
    await settle()
    assert w.written == []  # held: the worker only looked again
    w.busy = False
    await settle()
    assert [x.split("@")[0] for x in w.written] == ["status-a", "event-a"]
    assert w.depths[-1] == 0
    worker.cancel()


async def test_a_write_held_by_a_busy_director_runs_once_it_is_due() -> None:
    w = World()
    w.busy = True
    w.write("status-a")
    worker = asyncio.create_task(w.deferred.run())
    for _ in range(200):
        if w.written:
            break
        await asyncio.sleep(0)
    assert w.written == ["status-a@30"]  # never later than the delay, Director still busy
    worker.cancel()


async def test_with_the_queue_full_a_write_starts_at_once_and_beyond_that_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(max_pending=1, max_started=1)
    w.busy = True
    assert w.write("queued")
    assert w.write("started")  # the queue is full: not lost, started at once
    assert not w.write("refused")  # one started and still running: refused, the caller logs it
    await settle()
    assert w.written == ["started@0"]
    assert "queue full" in caplog.text
    await w.deferred.drain()  # shutdown: what waits is written without waiting for quiet
    assert w.written == ["started@0", "queued@0"]
    assert w.deferred.pending == 0


async def test_a_failing_write_does_not_stop_those_behind_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()

    async def broken() -> None:
        raise KeyError("a bug")

    w.deferred.defer(broken)
    w.write("next")
    worker = asyncio.create_task(w.deferred.run())
    await settle()
    assert w.written == ["next@0"]
    assert "deferred KCP write failed" in caplog.text
    worker.cancel()
