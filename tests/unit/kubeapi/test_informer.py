"""The informer's failure accounting, on httpx's MockTransport where the API server's answers
must be scripted: which failure count each wait is asked for, and a kind that appears later.
(Its behaviour against a real API server is in tests/integration/kubeapi/test_informer.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from kubeapi import ClusterAccess, Informer, KubeClient

EMPTY = {"metadata": {"resourceVersion": "1"}, "items": []}


def client_for(handle: Callable[[httpx.Request], httpx.Response]) -> KubeClient:
    access = ClusterAccess(server="https://kube.test", token="t")
    return KubeClient(access, user_agent="t", transport=httpx.MockTransport(handle))


async def yield_now(seconds: float) -> None:
    await asyncio.sleep(0)


def recording(client: KubeClient, asked: list[int], **kwargs: Any) -> Informer[object]:
    """An informer whose waits are instant and whose `delay` notes each failure count."""

    def delay(failures: int) -> float:
        asked.append(failures)
        return 1.0

    return Informer(client, "/x", name="t", parse=dict, delay=delay, sleep=yield_now, **kwargs)


async def run_until(informer: Informer[object], done: Callable[[], bool]) -> None:
    task = asyncio.create_task(informer.run())
    for _ in range(1000):
        if done():
            break
        await asyncio.sleep(0)
    assert not task.done(), task.exception() if task.done() else None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert done()


async def test_an_unreachable_api_server_is_retried_with_growing_waits() -> None:
    attempts = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        if request.url.params.get("watch") == "1":
            raise httpx.ReadError("stream broke", request=request)
        attempts += 1
        if attempts <= 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=EMPTY)

    asked: list[int] = []
    async with client_for(handle) as client:
        informer = recording(client, asked)
        await run_until(informer, lambda: informer.synced)
    assert asked[:3] == [1, 2, 3]  # three failed lists in a row: growing


async def test_each_drop_after_a_successful_list_starts_the_backoff_over() -> None:
    """The tenth disconnect of a long life is not waited out at the cap; a stream cut
    mid-line is a drop, not a crash."""
    lists = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal lists
        if request.url.params.get("watch") != "1":
            lists += 1
            return httpx.Response(200, json=EMPTY)
        if lists % 2:
            raise httpx.RemoteProtocolError("peer closed connection", request=request)
        return httpx.Response(200, content=b'{"type": "MODIFIED", "obj')  # cut mid-line

    asked: list[int] = []
    async with client_for(handle) as client:
        informer = recording(client, asked)
        await run_until(informer, lambda: informer.relists >= 10)
    assert set(asked) == {1}


async def test_a_kind_installed_later_is_listed_and_watched_once_it_appears() -> None:
    lists = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal lists
        if request.url.params.get("watch") == "1":
            return httpx.Response(200, content=b"")
        lists += 1
        if lists <= 2:
            return httpx.Response(404, json={"kind": "Status", "code": 404})
        item = {"metadata": {"name": "a", "resourceVersion": "7"}}
        return httpx.Response(200, json={"metadata": {"resourceVersion": "7"}, "items": [item]})

    notified: list[str] = []
    async with client_for(handle) as client:
        informer = recording(client, [], missing_kind_is_empty=True)
        informer.add_listener(notified.append)
        await run_until(informer, lambda: informer.synced)
        assert informer.relists == 0  # synced because the kind is absent, not because it listed
        await run_until(informer, lambda: informer.relists >= 1)
    assert notified[0] == "a"
