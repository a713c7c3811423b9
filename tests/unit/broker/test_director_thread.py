"""Director calls on their own loop and thread: results, errors and cancellation cross over."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from control_plane_broker.director.errors import DirectorRetryable
from control_plane_broker.director.thread import LoopThread


@pytest.fixture
def director_thread() -> Iterator[LoopThread]:
    thread = LoopThread("director-test")
    yield thread
    thread.stop()


async def test_a_call_runs_on_the_director_thread_and_returns_there(
    director_thread: LoopThread,
) -> None:
    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert await director_thread.run(where()) == "director-test"
    assert threading.current_thread().name != "director-test"


async def test_its_error_is_raised_to_the_caller(director_thread: LoopThread) -> None:
    async def down() -> None:
        raise DirectorRetryable("503", delivered=False)

    with pytest.raises(DirectorRetryable) as info:
        await director_thread.run(down())
    assert info.value.delivered is False


async def test_cancelling_the_caller_cancels_the_call(director_thread: LoopThread) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.create_task(director_thread.run(slow()))
    assert await asyncio.to_thread(started.wait, 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await asyncio.to_thread(cancelled.wait, 5)
