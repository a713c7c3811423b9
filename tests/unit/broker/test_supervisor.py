"""Background tasks are kept alive (restarted with backoff, counted, reported down while they
wait), and a wedged event loop is told from a busy one."""

from __future__ import annotations

import asyncio
import time

import pytest

from control_plane_broker.supervisor import HEALTHY_RUN_SECONDS, LoopWatch, Supervisor
from tests.unit.broker.conditions import until


class Boom(Exception):
    pass


async def test_a_failing_task_is_restarted_and_counted() -> None:
    restarts: list[str] = []
    runs = 0
    forever = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise Boom("lost the watch")
        await forever.wait()

    supervisor = Supervisor(on_restart=restarts.append, delay=lambda _: 0.0)
    supervisor.start("kyma-watch", flaky)
    await until(lambda: runs == 3, what="the third run")
    assert restarts == ["kyma-watch", "kyma-watch"]
    assert supervisor.down() == []  # running again
    await supervisor.stop()


async def test_a_task_that_returns_is_restarted_too() -> None:
    restarts: list[str] = []
    runs = 0
    forever = asyncio.Event()

    async def ends() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            return
        await forever.wait()

    supervisor = Supervisor(on_restart=restarts.append, delay=lambda _: 0.0)
    supervisor.start("sweep", ends)
    await until(lambda: runs == 2)
    assert restarts == ["sweep"]
    await supervisor.stop()


async def test_a_task_waiting_to_restart_is_down_if_required() -> None:
    async def broken() -> None:
        raise Boom("always")

    restarts: list[str] = []
    supervisor = Supervisor(on_restart=restarts.append, delay=lambda _: 3600.0)
    supervisor.start("mapping-watch", broken)
    supervisor.start("loop-watch", broken, required=False)
    await until(lambda: len(restarts) == 2)
    assert supervisor.down() == ["mapping-watch"]  # readiness fails for the required one only
    await supervisor.stop()  # a task waiting out its backoff stops at once


async def test_backoff_grows_with_failures_in_a_row_and_starts_over_after_a_healthy_run() -> None:
    now = [0.0]
    delays: list[int] = []
    runs = 0
    forever = asyncio.Event()

    async def task() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            now[0] += HEALTHY_RUN_SECONDS  # this run lasted: its failure is a first one
        if runs <= 3:
            raise Boom(str(runs))
        await forever.wait()

    def delay(failures: int) -> float:
        delays.append(failures)
        return 0.0

    supervisor = Supervisor(on_restart=lambda _: None, delay=delay, clock=lambda: now[0])
    supervisor.start("lease", task)
    await until(lambda: runs == 4)
    assert delays == [1, 2, 1]
    await supervisor.stop()


# --- loop watch ------------------------------------------------------------------------------


def test_a_late_tick_marks_the_loop_wedged_for_the_memory_period() -> None:
    now = [100.0]
    watch = LoopWatch(wedge_seconds=5.0, period=0.5, memory_seconds=30.0, clock=lambda: now[0])
    assert watch.healthy()
    now[0] = 106.0
    watch.tick(expected=100.5)  # fired 5.5 s late: the loop was blocked
    assert watch.max_lag == pytest.approx(5.5)
    assert not watch.healthy()
    # The ticker runs on time again, but liveness stays failed for the memory period.
    while now[0] < 136.0:
        now[0] += 0.5
        watch.tick(expected=now[0] - 0.01)
        assert watch.healthy() is (now[0] - 106.0 > 30.0)
    now[0] += 0.5
    watch.tick(expected=now[0])
    assert watch.healthy()


def test_a_busy_loop_below_the_wedge_stays_healthy() -> None:
    now = [0.0]
    watch = LoopWatch(wedge_seconds=5.0, period=0.5, clock=lambda: now[0])
    now[0] = 5.4
    watch.tick(expected=0.5)  # 4.9 s late
    assert watch.healthy()
    assert watch.max_lag == pytest.approx(4.9)


def test_every_tick_reports_how_late_it_ran_never_less_than_zero() -> None:
    now = [0.0]
    lags: list[float] = []
    watch = LoopWatch(wedge_seconds=5.0, period=0.5, clock=lambda: now[0], on_lag=lags.append)
    now[0] = 0.53
    watch.tick(expected=0.5)
    now[0] = 0.999  # a timer may fire a hair early
    watch.tick(expected=1.0)
    assert lags == [pytest.approx(0.03), 0.0]


def test_a_ticker_that_stopped_is_unhealthy() -> None:
    now = [0.0]
    watch = LoopWatch(wedge_seconds=5.0, period=0.5, clock=lambda: now[0])
    now[0] = 5.4
    assert watch.healthy()
    now[0] = 5.5  # no tick for wedge + period: nothing runs on time any more
    assert not watch.healthy()


async def test_the_ticker_notices_a_blocked_loop() -> None:
    watch = LoopWatch(wedge_seconds=0.5, period=0.01, memory_seconds=60.0)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.05)
        assert watch.healthy()
        time.sleep(0.7)  # noqa: ASYNC251 (the point: a blocking call on the loop)
        await until(lambda: watch.max_lag >= 0.5, what="the late tick")
        assert not watch.healthy()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_every_task_is_reported_when_it_starts_not_only_when_it_fails() -> None:
    started: list[str] = []
    restarts: list[str] = []
    forever = asyncio.Event()
    supervisor = Supervisor(on_start=started.append, on_restart=restarts.append)
    supervisor.start("kyma-watch", forever.wait)
    supervisor.start("sweep", forever.wait, required=False)
    assert started == ["kyma-watch", "sweep"]
    assert restarts == []
    await supervisor.stop()
