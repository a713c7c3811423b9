"""The REST client's edges on httpx's MockTransport: answers a real API server does not give
(garbage bodies, broken streams) must still become `KubeError`s; paging; request counting.
Behaviour against Kubernetes itself is tested on real API servers (tests/integration/kubeapi)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from kubeapi import (
    ClusterAccess,
    Conflict,
    Gone,
    KubeClient,
    KubeError,
    KubeRejected,
    KubeUnavailable,
    NotFound,
)
from kubeapi.client import _decode, _watch_event
from kubeapi.kube_errors import error_for_status

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler, **kwargs: object) -> KubeClient:
    access = ClusterAccess(server="https://kube.test", token="t")
    return KubeClient(
        access,
        user_agent="kubeapi-test",
        transport=httpx.MockTransport(handler),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (429, KubeUnavailable),
        (500, KubeUnavailable),
        (503, KubeUnavailable),
        (400, KubeRejected),
        (403, KubeRejected),
        (422, KubeRejected),
        (302, KubeUnavailable),
    ],
)
def test_each_status_has_its_error(status: int, cls: type[KubeError]) -> None:
    error = error_for_status(status, "x")
    assert type(error) is cls
    assert error.status == status


@pytest.mark.parametrize(
    "raw",
    [b"<html>proxy error</html>", b"[1, 2]", b'"text"', b"{" * 100000, b"\xff\xfe"],
)
def test_a_body_that_is_not_a_json_object_is_unavailable(raw: bytes) -> None:
    with pytest.raises(KubeUnavailable):
        _decode(200, raw, "GET /x")


def test_an_error_status_keeps_the_status_message_on_one_bounded_line() -> None:
    body = json.dumps({"kind": "Status", "message": "no\nway " + "x" * 1000}).encode()
    with pytest.raises(KubeRejected) as caught:
        _decode(403, body, "GET /x")
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 400
    with pytest.raises(NotFound):
        _decode(404, b"<html>", "GET /x")  # a body that is no Status still has its status


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        (b'{"type": "MODIFIED", "obj', KubeUnavailable),
        (b"not json", KubeUnavailable),
        (b"[]", KubeUnavailable),
        (b'{"type": "MODIFIED"}', KubeUnavailable),
        (b'{"type": "WHATEVER", "object": {}}', KubeUnavailable),
        (b'{"type": "ERROR", "object": {"code": 410, "message": "too old"}}', Gone),
        (b'{"type": "ERROR", "object": {"code": "410"}}', KubeUnavailable),
        (b'{"type": "ERROR", "object": {"code": 403}}', KubeRejected),
        (b'{"type": "ERROR", "object": {"code": true}}', KubeUnavailable),
    ],
)
def test_a_watch_line_that_is_no_event_is_a_kube_error(line: bytes, cls: type[KubeError]) -> None:
    with pytest.raises(cls):
        _watch_event(line, "WATCH /x")


async def test_list_follows_continue_pages_and_counts_every_request() -> None:
    seen: list[dict[str, str]] = []
    counted: list[tuple[str, int | None]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        seen.append(params)
        assert request.headers["authorization"] == "Bearer t"
        assert request.headers["user-agent"] == "kubeapi-test"
        page = params.get("continue", "0")
        more = {"0": "1", "1": "2"}.get(page)
        return httpx.Response(
            200,
            json={
                "metadata": {
                    "resourceVersion": f"rv{page}",
                    **({"continue": more} if more else {}),
                },
                "items": [{"metadata": {"name": f"o{page}"}}],
            },
        )

    async with client_for(handle, on_request=lambda v, s: counted.append((v, s))) as client:
        listing = await client.list("/api/v1/namespaces/n/secrets", label_selector="a=b")
    assert [i["metadata"]["name"] for i in listing.items] == ["o0", "o1", "o2"]
    assert listing.resource_version == "rv2"
    assert all(p["labelSelector"] == "a=b" and p["limit"] == "500" for p in seen)
    assert counted == [("list", 200)] * 3


async def test_an_expired_continue_token_falls_back_to_one_unpaged_list() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if "continue" in params:
            return httpx.Response(410, json={"kind": "Status", "code": 410})
        if "limit" not in params:
            return httpx.Response(
                200,
                json={
                    "metadata": {"resourceVersion": "9"},
                    "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
                },
            )
        return httpx.Response(
            200,
            json={"metadata": {"continue": "c"}, "items": [{"metadata": {"name": "a"}}]},
        )

    async with client_for(handle) as client:
        listing = await client.list("/x")
    assert [i["metadata"]["name"] for i in listing.items] == ["a", "b"]
    assert listing.resource_version == "9"


@pytest.mark.parametrize(
    "body", [{"metadata": {}}, {"items": "x"}, {"items": [1, 2]}, {"items": {"a": 1}}]
)
async def test_a_list_without_an_items_list_is_unavailable(body: dict[str, object]) -> None:
    async with client_for(lambda r: httpx.Response(200, json=body)) as client:
        with pytest.raises(KubeUnavailable):
            await client.list("/x")


async def test_transport_failures_and_oversized_answers_are_unavailable_and_counted() -> None:
    counted: list[tuple[str, int | None]] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with client_for(refuse, on_request=lambda v, s: counted.append((v, s))) as client:
        with pytest.raises(KubeUnavailable):
            await client.get("/x")
        with pytest.raises(KubeUnavailable):
            await anext(client.watch("/x", resource_version="1"))
    assert counted == [("get", None), ("watch", None)]

    big = httpx.Response(200, content=b'{"a": "' + b"x" * 5000 + b'"}')
    async with client_for(lambda r: big, max_body_bytes=1000) as client:
        with pytest.raises(KubeUnavailable, match="too large"):
            await client.get("/x")


async def test_a_token_file_that_vanished_is_unavailable_not_an_os_error(tmp_path: object) -> None:
    from pathlib import Path  # noqa: PLC0415

    access = ClusterAccess(server="https://kube.test", token_file=Path(str(tmp_path)) / "gone")
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    async with KubeClient(access, user_agent="t", transport=transport) as client:
        with pytest.raises(KubeUnavailable, match="token file"):
            await client.get("/x")


async def test_delete_reports_whether_it_deleted_and_sends_preconditions() -> None:
    bodies: list[dict[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(404 if len(bodies) > 1 else 200, json={})

    async with client_for(handle) as client:
        assert await client.delete("/x", resource_version="7") is True
        assert await client.delete("/x") is False
    assert bodies[0]["preconditions"] == {"resourceVersion": "7"}
    assert "preconditions" not in bodies[1]


async def test_watch_yields_typed_events_and_a_cut_stream_ends_in_unavailable() -> None:
    lines = [
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "2"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}},
    ]
    content = b"".join(json.dumps(x).encode() + b"\n" for x in lines) + b'{"type": "MOD'

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.params["allowWatchBookmarks"] == "true"
        assert request.url.params["resourceVersion"] == "1"
        return httpx.Response(200, content=content)

    seen: list[tuple[str, str | None]] = []

    async def consume(client: KubeClient) -> None:
        async for event in client.watch("/x", resource_version="1"):
            seen.append((event.type, event.resource_version))

    async with client_for(handle) as client:
        with pytest.raises(KubeUnavailable, match="garbled"):
            await consume(client)
    assert seen == [("ADDED", "2"), ("BOOKMARK", "3")]
