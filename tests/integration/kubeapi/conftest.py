"""The Kubernetes layer against a real API server: a `kube` client on the control-plane test
cluster, a fresh namespace per test, and transports that tamper with the real traffic (one
garbled watch line, a rewound watch version) where a test needs the server to misbehave."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from devenv.clusters import TestCluster
from kubeapi import ClusterAccess, KubeClient, access_from_kubeconfig_file


@pytest.fixture
def access(control_plane: TestCluster) -> ClusterAccess:
    return access_from_kubeconfig_file(control_plane.kubeconfig_path)


@pytest.fixture
async def kube(access: ClusterAccess) -> AsyncIterator[KubeClient]:
    async with KubeClient(access, user_agent="kubeapi-tests") as client:
        yield client


@pytest.fixture
def ns(control_plane: TestCluster, namespace_factory: Callable[..., str]) -> str:
    return namespace_factory(control_plane)


def configmap(name: str, value: str = "v", **labels: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"value": value},
    }


class _Garbled(httpx.AsyncByteStream):
    """The real stream, with one line of garbage after the first chunk that ends a line."""

    def __init__(self, inner: httpx.AsyncByteStream, garbage: bytes) -> None:
        self._inner = inner
        self._garbage = garbage

    async def __aiter__(self) -> AsyncIterator[bytes]:
        injected = False
        async for chunk in self._inner:
            yield chunk
            if not injected and b"\n" in chunk:
                injected = True
                yield self._garbage

    async def aclose(self) -> None:
        await self._inner.aclose()


class Tamper(httpx.AsyncBaseTransport):
    """The real connection to the API server; the n-th watch request can be altered:
    `garble_watch` puts a garbage line into its stream, `rewind_watch` asks it for a version
    long compacted away (the server answers 410 Gone)."""

    def __init__(self, access: ClusterAccess) -> None:
        self.inner = httpx.AsyncHTTPTransport(verify=access.ssl_context())
        self.watches = 0
        self.garble_watch: int | None = None
        self.rewind_watch: int | None = None
        self.tampered = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "1":
            self.watches += 1
            if self.watches == self.rewind_watch:
                self.tampered += 1
                request.url = request.url.copy_set_param("resourceVersion", "1")
        response = await self.inner.handle_async_request(request)
        if self.watches == self.garble_watch and request.url.params.get("watch") == "1":
            self.tampered += 1
            assert isinstance(response.stream, httpx.AsyncByteStream)
            garbled = _Garbled(response.stream, b'{"type": "MODIFIED", "object": {garbage\n')
            return httpx.Response(
                response.status_code,
                headers=response.headers,
                stream=garbled,
                extensions=response.extensions,
            )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class Gate:
    """An injectable `sleep` that a test can hold shut, to act while an informer waits."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.sleeping = 0
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.sleeping += 1
        try:
            await self.open.wait()
            await asyncio.sleep(min(seconds, 0.05))
        finally:
            self.sleeping -= 1
