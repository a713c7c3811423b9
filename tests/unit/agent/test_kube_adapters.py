"""Kube adapters on httpx's MockTransport: watch resumption, idempotent secret writes."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from datetime import UTC, datetime

import httpx
import pytest

from agent.kube.api import KubeClient, KubeConfig
from agent.kube.secret import (
    WriteResult,
    delete_managed_secret,
    desired_secret,
    differs,
    write_secret,
)
from agent.kube.watch import Watcher
from agent.outcomes import Issued
from agent.retry import Jitter, RetryPolicy

ISSUED = Issued(
    token="ott-1",
    connector_url="https://c/graphql",
    compass_runtime_id="c-1",
    tenant="ga-1",
    expires_at=datetime(2025, 1, 1, 13, tzinfo=UTC),
    issued_at=datetime(2025, 1, 1, 12, tzinfo=UTC),
)


def client_for(handler: httpx.MockTransport) -> KubeClient:
    config = KubeConfig("https://kube.test", ssl.create_default_context(), lambda: "t")
    return KubeClient(config, transport=handler)


async def test_watch_relists_after_410_gone_and_resumes_from_the_new_version() -> None:
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if params.get("watch") != "1":
            calls.append(f"list:{len([c for c in calls if c.startswith('list')]) + 1}")
            rv = "100" if len(calls) == 1 else "200"
            return httpx.Response(200, json={"metadata": {"resourceVersion": rv}, "items": []})
        calls.append(f"watch@{params['resourceVersion']}")
        if params["resourceVersion"] == "100":
            gone = {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "message": "too old"},
            }
            return httpx.Response(200, content=(json.dumps(gone) + "\n").encode())
        modified = {"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "201"}}}
        return httpx.Response(200, content=(json.dumps(modified) + "\n").encode())

    notified = 0

    def notify() -> None:
        nonlocal notified
        notified += 1

    client = client_for(httpx.MockTransport(handle))
    watcher = Watcher(client, "/api/v1/namespaces/x/secrets", name="t", notify=notify,
                      policy=RetryPolicy(base=0.01, cap=0.01, jitter=Jitter.NONE))  # fmt: skip
    task = asyncio.create_task(watcher.run())
    for _ in range(200):
        if "watch@201" in calls:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()
    assert calls[:4] == ["list:1", "watch@100", "list:2", "watch@200"]
    assert "watch@201" in calls  # resumed from the version of the last event
    assert notified >= 3  # each list, and the MODIFIED event
    assert watcher.synced.is_set()


def test_desired_secret_shape() -> None:
    body = desired_secret(
        namespace="kyma-system", name="compass-agent-configuration", issued=ISSUED
    )
    assert body["type"] == "Opaque"
    decoded = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    assert decoded == {
        "CONNECTOR_URL": "https://c/graphql",
        "TOKEN": "ott-1",
        "RUNTIME_ID": "c-1",
        "TENANT": "ga-1",
    }
    annotations = body["metadata"]["annotations"]
    expires = annotations["compass-agent.kyma-project.io/token-expires-at"]
    assert expires == "2025-01-01T13:00:00.000Z"
    assert "ott-1" not in json.dumps(body["metadata"])


def test_differs_ignores_other_writers_metadata() -> None:
    desired = desired_secret(namespace="n", name="s", issued=ISSUED)
    stored = json.loads(json.dumps(desired))
    stored["metadata"]["labels"]["someone-else"] = "x"
    stored["metadata"]["resourceVersion"] = "5"
    assert not differs(desired, stored)
    stored["data"]["TOKEN"] = base64.b64encode(b"other").decode()
    assert differs(desired, stored)


async def test_write_secret_creates_then_leaves_unchanged_then_updates() -> None:
    store: dict[str, dict[str, object]] = {}
    writes: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        name = "/api/v1/namespaces/n/secrets/s"
        if request.method == "GET":
            return (
                httpx.Response(200, json=store[name])
                if name in store
                else httpx.Response(404, json={})
            )
        body = json.loads(request.content)
        body.setdefault("metadata", {})["resourceVersion"] = str(len(writes) + 1)
        store[name] = body
        writes.append(request.method)
        return httpx.Response(201 if request.method == "POST" else 200, json=body)

    client = client_for(httpx.MockTransport(handle))
    desired = desired_secret(namespace="n", name="s", issued=ISSUED)
    assert await write_secret(client, desired) is WriteResult.CREATED
    assert await write_secret(client, desired) is WriteResult.UNCHANGED
    newer = desired_secret(
        namespace="n", name="s", issued=Issued(**{**ISSUED.__dict__, "token": "ott-2"})
    )
    assert await write_secret(client, newer) is WriteResult.UPDATED
    await client.aclose()
    assert writes == ["POST", "PUT"]


async def test_delete_only_touches_a_secret_the_agent_wrote() -> None:
    deleted: list[str] = []
    foreign = {
        "metadata": {
            "name": "s",
            "resourceVersion": "1",
            "labels": {"app.kubernetes.io/managed-by": "other"},
        }
    }

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            deleted.append(request.url.path)
            return httpx.Response(200, json={})
        return httpx.Response(200, json=foreign)

    client = client_for(httpx.MockTransport(handle))
    assert not await delete_managed_secret(client, namespace="n", name="s")
    await client.aclose()
    assert deleted == []


async def test_watch_survives_an_unreachable_api_server_with_backoff() -> None:
    attempts = 0
    sleeps: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        if request.url.params.get("watch") == "1":
            return httpx.Response(200, content=b"")  # the server ends the watch at once
        attempts += 1
        if attempts <= 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": []})

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    client = client_for(httpx.MockTransport(handle))
    policy = RetryPolicy(base=1.0, cap=4.0, jitter=Jitter.NONE)
    watcher = Watcher(
        client,
        "/api/v1/namespaces/x/secrets",
        name="t",
        notify=lambda: None,
        policy=policy,
        sleep=sleep,
    )
    task = asyncio.create_task(watcher.run())
    for _ in range(100):
        if watcher.synced.is_set():
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()
    assert watcher.synced.is_set()
    # Three failed lists, backing off, then a list that works.
    assert sleeps[:3] == [1.0, 2.0, 4.0]


async def test_each_dropped_watch_is_retried_promptly_and_garbage_does_not_kill_it() -> None:
    """A watch that lists fine and then drops starts its backoff over: the tenth disconnect of
    a long life is not waited out at the cap. A stream cut mid-line is a drop, not a crash."""
    lists = 0
    sleeps: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal lists
        if request.url.params.get("watch") != "1":
            lists += 1
            return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": []})
        if lists % 2:
            raise httpx.RemoteProtocolError("peer closed connection", request=request)
        return httpx.Response(200, content=b'{"type": "MODIFIED", "obj')  # cut mid-line

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    client = client_for(httpx.MockTransport(handle))
    watcher = Watcher(
        client,
        "/api/v1/namespaces/x/secrets",
        name="t",
        notify=lambda: None,
        policy=RetryPolicy(base=1.0, cap=300.0, jitter=Jitter.NONE),
        sleep=sleep,
    )
    task = asyncio.create_task(watcher.run())
    for _ in range(500):
        if watcher.relists >= 10:
            break
        await asyncio.sleep(0)
    assert not task.done(), task.exception() if task.done() else None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()
    assert watcher.relists >= 10
    assert set(sleeps) == {1.0}, sleeps  # the first step every time, never growing


async def test_a_kind_that_is_not_installed_counts_as_synced_and_is_looked_for_again() -> None:
    """No CRD yet (404 on list): readiness is not held back, and the watch starts once it
    appears."""
    lists = 0
    notified = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal lists
        if request.url.params.get("watch") == "1":
            return httpx.Response(200, content=b"")
        lists += 1
        if lists <= 2:
            return httpx.Response(404, json={"kind": "Status", "code": 404, "message": "nope"})
        return httpx.Response(200, json={"metadata": {"resourceVersion": "7"}, "items": []})

    def notify() -> None:
        nonlocal notified
        notified += 1

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0)

    client = client_for(httpx.MockTransport(handle))
    watcher = Watcher(
        client,
        "/apis/operator.kyma-project.io/v1alpha1/namespaces/x/applicationconnectors",
        name="t",
        notify=notify,
        policy=RetryPolicy(base=1.0, cap=4.0, jitter=Jitter.NONE),
        sleep=sleep,
    )
    task = asyncio.create_task(watcher.run())
    for _ in range(200):
        if watcher.synced.is_set():
            break
        await asyncio.sleep(0)
    assert watcher.synced.is_set()
    assert watcher.relists == 0  # synced because the kind is absent, not because it listed
    assert notified == 1
    for _ in range(200):
        if watcher.relists >= 1:
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()
    assert watcher.relists >= 1  # the CRD appeared: listed and watching
