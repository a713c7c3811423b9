"""`Informer` on a real API server: it survives a garbled watch line, a 410 Gone and a cut
connection, reports the deletions it missed meanwhile, tolerates hostile objects and kinds
that are not installed."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from devenv.clusters import TestCluster
from kubeapi import JSON, ClusterAccess, Informer, KubeClient
from tests.integration.kubeapi.conftest import Gate, Tamper, configmap
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.waiting import eventually


def value_of(obj: JSON) -> str:
    value = obj["data"]["value"]
    if value == "hostile":
        raise ValueError(f"refusing {value!r}")
    return str(value)


@asynccontextmanager
async def running(informer: Informer[Any]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.synced, within=10, what="the informer to sync")
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def informer_for(client: KubeClient, ns: str, **kwargs: Any) -> Informer[str]:
    kwargs.setdefault("delay", lambda failures: 0.05)
    return Informer(
        client, f"/api/v1/namespaces/{ns}/configmaps", name="cm", parse=value_of, **kwargs
    )


def cms(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


async def test_a_garbled_watch_line_is_a_dropped_watch_and_the_store_recovers(
    access: ClusterAccess, kube: KubeClient, ns: str
) -> None:
    tamper = Tamper(access)
    tamper.garble_watch = 1
    notified: list[str] = []
    async with KubeClient(access, user_agent="t", transport=tamper) as client:
        informer = informer_for(client, ns)
        informer.add_listener(notified.append)
        async with running(informer) as task:
            await kube.create(cms(ns), configmap("a", "1"))  # its event carries the garbage
            await eventually(lambda: informer.relists >= 2, what="a re-list after the garbage")
            await kube.create(cms(ns), configmap("b", "2"))
            await eventually(lambda: informer.get("b") == "2", what="b through the new watch")
            assert not task.done()
    assert tamper.tampered == 1
    assert informer.get("a") == "1"
    assert sorted(informer.names()) == ["a", "b"]
    assert "a" in notified
    assert "b" in notified


def compact_etcd(cluster: TestCluster) -> None:
    """Compacts the cluster's etcd up to now: older versions are gone for good."""
    key = base64.b64encode(b"/").decode()
    with httpx.Client(timeout=10) as http:
        revision = http.post(f"{cluster.etcd_url}/v3/kv/range", json={"key": key}).json()
        body = {"revision": revision["header"]["revision"], "physical": True}
        http.post(f"{cluster.etcd_url}/v3/kv/compaction", json=body).raise_for_status()


def event(ns: str, name: str, message: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": "x", "apiVersion": "v1", "namespace": ns},
        "reason": "Test",
        "message": message,
    }


async def test_410_gone_relists_at_once(
    control_plane: TestCluster, access: ClusterAccess, kube: KubeClient, ns: str
) -> None:
    """Events are watched straight from etcd (no watch cache): once etcd is compacted, a watch
    from an old version gets a real 410 Gone from the API server."""
    events = f"/api/v1/namespaces/{ns}/events"
    await kube.create(events, event(ns, "before", "1"))
    compact_etcd(control_plane)
    tamper = Tamper(access)
    tamper.rewind_watch = 1
    gate = Gate()
    async with KubeClient(access, user_agent="t", transport=tamper) as client:
        informer: Informer[str] = Informer(
            client,
            events,
            name="events",
            parse=lambda obj: str(obj["message"]),
            delay=lambda failures: 30.0,
            sleep=gate.sleep,
        )
        async with running(informer):
            await eventually(lambda: informer.relists >= 2, what="a re-list after 410")
            await kube.create(events, event(ns, "after", "2"))
            await eventually(lambda: informer.get("after") == "2", what="the next watch")
    assert tamper.tampered == 1
    assert gate.slept == []  # a 410 waits for nothing (the 30 s delay was never used)
    assert informer.get("before") == "1"


async def test_a_cut_connection_relists_and_reports_the_deletions_it_missed(
    control_plane: TestCluster, access: ClusterAccess, kube: KubeClient, ns: str
) -> None:
    for name in ("keep", "gone"):
        await kube.create(cms(ns), configmap(name))
    target = urlsplit(control_plane.server)
    assert target.hostname is not None
    assert target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    await proxy.start()
    gate = Gate()
    notified: list[str] = []
    proxied = replace(access, server=f"https://127.0.0.1:{proxy.port}")
    try:
        async with KubeClient(proxied, user_agent="t") as client:
            informer = informer_for(client, ns, sleep=gate.sleep)
            informer.add_listener(notified.append)
            async with running(informer) as task:
                assert sorted(informer.names()) == ["gone", "keep"]
                await asyncio.sleep(0.5)  # let the watch request reach the server
                gate.open.clear()
                proxy.cut()
                await eventually(lambda: gate.sleeping, what="the informer to back off")
                # Deleted while the informer is not watching: no DELETED event will tell it.
                assert await kube.delete(f"{cms(ns)}/gone")
                notified.clear()
                gate.open.set()
                await eventually(lambda: informer.get("gone") is None, what="the re-list")
                assert not task.done()
        assert notified == ["gone"]
        assert informer.missed_deletions == 1
        assert informer.relists == 2
        assert informer.names() == ["keep"]
    finally:
        await proxy.stop()


async def test_a_hostile_object_is_absent_and_the_rest_goes_on(kube: KubeClient, ns: str) -> None:
    await kube.create(cms(ns), configmap("bad", "hostile"))
    await kube.create(cms(ns), configmap("good", "1"))
    informer = informer_for(kube, ns)
    async with running(informer) as task:
        assert informer.names() == ["good"]
        await kube.merge_patch(f"{cms(ns)}/good", {"data": {"value": "hostile"}})
        await eventually(lambda: informer.get("good") is None, what="good turned hostile")
        await kube.merge_patch(f"{cms(ns)}/bad", {"data": {"value": "fine"}})
        await eventually(lambda: informer.get("bad") == "fine", what="bad turned fine")
        assert not task.done()


async def test_last_contact_moves_with_events_and_a_relist(kube: KubeClient, ns: str) -> None:
    informer = informer_for(kube, ns)
    async with running(informer):
        listed = informer.last_contact
        assert listed is not None
        await kube.create(cms(ns), configmap("x"))
        await eventually(lambda: informer.get("x"), what="the event")
        assert informer.last_contact is not None
        assert informer.last_contact > listed


async def test_a_kind_that_is_not_installed_counts_as_empty_only_when_asked(
    kube: KubeClient, ns: str
) -> None:
    path = f"/apis/nothing.example.com/v1/namespaces/{ns}/gizmos"
    gate = Gate()
    empty: Informer[JSON] = Informer(
        kube,
        path,
        name="gizmo",
        parse=dict,
        delay=lambda n: 0.05,
        missing_kind_is_empty=True,
        sleep=gate.sleep,
    )
    async with running(empty) as task:
        assert empty.values() == []
        assert empty.relists == 0
        await eventually(lambda: len(gate.slept) >= 3, what="looking again, with backoff")
        assert not task.done()
    strict: Informer[JSON] = Informer(kube, path, name="gizmo", parse=dict, delay=lambda n: 0.05)
    task = asyncio.create_task(strict.run())
    try:
        await asyncio.sleep(1.0)
        assert not strict.synced
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_that_ends_at_once_does_not_spin(access: ClusterAccess, ns: str) -> None:
    """Here every watch ends (the server's 1 s timeout) before `min_watch_seconds`: each end
    is followed by a wait that grows, as a proxy closing every stream at once would cause."""
    calls: list[str] = []
    asked: list[int] = []

    def delay(quick_ends: int) -> float:
        asked.append(quick_ends)
        return 0.05

    async with KubeClient(access, user_agent="t", on_request=lambda v, s: calls.append(v)) as c:
        informer = informer_for(c, ns, delay=delay, timeout_seconds=1, min_watch_seconds=5.0)
        async with running(informer):
            await eventually(lambda: len(asked) >= 3, within=10, what="three watch ends")
    assert asked[:3] == [1, 2, 3]
    assert calls.count("list") == 1  # the watch resumed each time, no re-list
    assert calls.count("watch") <= len(asked) + 1


async def test_the_store_holds_no_managed_fields_and_an_update_from_it_keeps_the_servers(
    kube: KubeClient, ns: str
) -> None:
    informer: Informer[JSON] = Informer(
        kube, cms(ns), name="cm", parse=lambda obj: obj, delay=lambda failures: 0.05
    )
    async with running(informer):
        await kube.create(cms(ns), configmap("a", "1"))
        await eventually(lambda: informer.get("a") is not None, what="a in the store")
        stored = informer.get("a")
        assert stored is not None
        assert "managedFields" not in stored["metadata"]
        on_server = await kube.get(f"{cms(ns)}/a")
        assert on_server["metadata"]["managedFields"], "the server tracks managers of a"

        changed = {**stored, "data": {"value": "2"}}
        await kube.replace(f"{cms(ns)}/a", changed)
        after = await kube.get(f"{cms(ns)}/a")
    assert after["data"] == {"value": "2"}
    assert after["metadata"]["managedFields"], "an update without managedFields keeps them"
