"""The HTTP surface in process (ASGI): readiness follows the Kyma cache, runtime IDs are checked
before anything is looked up, and every error, routing errors included, is a problem."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import pytest

from control_plane_broker.api.app import create_app
from control_plane_broker.issuing import TokenIssuer
from control_plane_broker.kube.client import KubeClient
from control_plane_broker.kube.config import ClusterAccess
from control_plane_broker.kube.kyma_cache import KymaCache
from control_plane_broker.metrics import Metrics
from control_plane_broker.settings import Settings

PROBLEM = "urn:kyma-compass-pull:broker:problem:"


class Untouchable:
    """Stands in for every collaborator that must not be reached; records any attempt."""

    def __init__(self, name: str, touched: list[str]) -> None:
        self._name = name
        self._touched = touched

    def __getattr__(self, attr: str) -> Any:
        self._touched.append(f"{self._name}.{attr}")
        raise AssertionError(f"{self._name}.{attr} reached")


class Cache:
    def __init__(self, touched: list[str]) -> None:
        self.synced = False
        self._touched = touched

    def get(self, name: str) -> None:
        self._touched.append(f"cache.get({name})")


@pytest.fixture
async def world() -> AsyncIterator[tuple[httpx.AsyncClient, Cache, list[str]]]:
    touched: list[str] = []
    cache = Cache(touched)
    issuer = TokenIssuer(
        settings=Settings(),
        cache=cast(Any, cache),
        verifier=cast(Any, Untouchable("verifier", touched)),
        registration=cast(Any, Untouchable("registration", touched)),
        director=cast(Any, Untouchable("director", touched)),
        repo=cast(Any, Untouchable("repo", touched)),
        events=cast(Any, Untouchable("events", touched)),
        limiter=cast(Any, Untouchable("limiter", touched)),
        clock=lambda: 0.0,
        wall=lambda: 0.0,
    )
    app = create_app(
        issuer=issuer,
        metrics=Metrics(),
        ready=lambda: cache.synced,
        jitter_max=2,
        rand=lambda: 0.5,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        yield client, cache, touched


def kind(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


async def test_readyz_and_token_wait_for_the_cache(world: Any) -> None:
    client, cache, touched = world
    assert (await client.get("/readyz")).status_code == 503
    r = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "Bearer x"})
    assert (r.status_code, kind(r)) == (503, "not-ready")
    assert r.headers["Retry-After"] == "3"  # 2 s + half of the 2 s jitter
    assert touched == []
    cache.synced = True
    assert (await client.get("/readyz")).status_code == 200


@pytest.mark.parametrize(
    "runtime_id", ["a" * 64, "-leading", "trailing-", "under_score", "dot.ted", "q%22uote"]
)
async def test_malformed_runtime_id_is_refused_before_any_lookup(
    world: Any, runtime_id: str
) -> None:
    client, cache, touched = world
    cache.synced = True
    r = await client.post(f"/v1/runtimes/{runtime_id}/token", headers={"Authorization": "x"})
    assert (r.status_code, kind(r)) == (400, "malformed-request")
    assert touched == []  # not the cache, not the verifier, not Director


async def test_routing_errors_are_problems_too(world: Any) -> None:
    client, _, touched = world
    r = await client.post("/v1/runtimes/a/b/token")
    assert (r.status_code, kind(r)) == (404, "not-found")
    r = await client.get("/v1/runtimes/rt-1/token")
    assert (r.status_code, kind(r)) == (405, "method-not-allowed")
    assert touched == []


async def test_kyma_cache_is_synced_only_after_a_complete_list() -> None:
    lists: list[int] = []

    def kcp(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            return httpx.Response(503, json={"message": "later"})  # re-lists after a pause
        lists.append(1)
        if len(lists) == 1:
            return httpx.Response(500, json={"message": "etcd unavailable"})
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": []})

    client = KubeClient(ClusterAccess(server="http://kcp.test"), transport=httpx.MockTransport(kcp))
    cache = KymaCache(client, namespace="kcp-system", retry_seconds=0.05)
    assert not cache.synced
    task = asyncio.create_task(cache.run())
    try:
        assert await cache.wait_synced(5)
        assert len(lists) >= 2  # the failed list did not count as synced
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()


async def test_kyma_cache_does_not_spin_on_watch_streams_that_end_at_once() -> None:
    watches: list[int] = []

    def kcp(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            watches.append(1)
            return httpx.Response(200, text="")  # ends at once, no events
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": []})

    client = KubeClient(ClusterAccess(server="http://kcp.test"), transport=httpx.MockTransport(kcp))
    cache = KymaCache(client, namespace="kcp-system", retry_seconds=0.1)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.sleep(0.5)
        assert 1 <= len(watches) <= 10  # paced by retry_seconds, not thousands
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
