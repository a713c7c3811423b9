"""`EventRecorder` and `KubeClient` verbs on a real API server: repeated events become one
Event with a count (as `kubectl get events` shows them), writes are counted, and the verbs
keep Kubernetes' semantics (paging, optimistic concurrency, JSON patch tests)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from devenv.clusters import TestCluster
from kubeapi import (
    ClusterAccess,
    Conflict,
    EventRecorder,
    KubeClient,
    KubeRejected,
    NotFound,
    ObjectRef,
    access_from_untrusted_kubeconfig,
)
from tests.integration.kubeapi.conftest import configmap


class WallClock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_the_same_event_three_times_is_one_event_with_count_3(
    access: ClusterAccess, ns: str
) -> None:
    clock = WallClock()
    calls: Counter[str] = Counter()
    async with KubeClient(access, user_agent="t", on_request=lambda v, s: calls.update([v])) as c:
        recorder = EventRecorder(c, namespace=ns, component="kubeapi-test", host="h1", clock=clock)
        about = ObjectRef("v1", "ConfigMap", "subject", namespace=ns, uid="uid-1")
        for _ in range(3):
            await recorder.record(about, type_="Normal", reason="Pulled", message="token for x")
            clock.now += timedelta(seconds=30)
        await recorder.record(about, type_="Warning", reason="Refused", message="no")
        listing = await c.list(f"/api/v1/namespaces/{ns}/events")
    assert calls == {"create": 2, "patch": 2, "list": 1}  # one request per record
    by_reason = {e["reason"]: e for e in listing.items}
    assert set(by_reason) == {"Pulled", "Refused"}
    pulled = by_reason["Pulled"]
    assert pulled["count"] == 3
    assert pulled["firstTimestamp"] == "2030-01-01T12:00:00Z"
    assert pulled["lastTimestamp"] == "2030-01-01T12:01:00Z"
    assert pulled["type"] == "Normal"
    assert pulled["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "subject",
        "namespace": ns,
        "uid": "uid-1",
    }
    assert pulled["source"] == {"component": "kubeapi-test", "host": "h1"}
    assert pulled["reportingComponent"] == "kubeapi-test"
    assert by_reason["Refused"]["count"] == 1


async def test_events_outside_the_window_or_expired_are_new_ones(kube: KubeClient, ns: str) -> None:
    clock = WallClock()
    recorder = EventRecorder(kube, namespace=ns, component="c", host="h", clock=clock, window=60)
    about = ObjectRef("v1", "ConfigMap", "subject")  # the recorder's namespace
    await recorder.record(about, type_="Normal", reason="R", message="m")
    clock.now += timedelta(seconds=61)
    await recorder.record(about, type_="Normal", reason="R", message="m")
    events = (await kube.list(f"/api/v1/namespaces/{ns}/events")).items
    assert [e["count"] for e in events] == [1, 1]
    # The API server dropped the event (its TTL): the next one is created again.
    for e in events:
        await kube.delete(f"/api/v1/namespaces/{ns}/events/{e['metadata']['name']}")
    await recorder.record(about, type_="Normal", reason="R", message="m")
    events = (await kube.list(f"/api/v1/namespaces/{ns}/events")).items
    assert [e["count"] for e in events] == [1]


async def test_concurrent_records_of_one_event_write_one_event(kube: KubeClient, ns: str) -> None:
    recorder = EventRecorder(kube, namespace=ns, component="c", host="h")
    about = ObjectRef("v1", "ConfigMap", "subject", namespace=ns)
    message = "ä" * 2000
    await asyncio.gather(
        *(recorder.record(about, type_="Normal", reason="R", message=message) for _ in range(5))
    )
    events = (await kube.list(f"/api/v1/namespaces/{ns}/events")).items
    assert len(events) == 1
    assert events[0]["count"] == 5
    assert len(events[0]["message"].encode()) <= 1024


async def test_a_failing_record_never_raises(
    kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = EventRecorder(kube, namespace="no-such-namespace-x", component="c", host="h")
    about = ObjectRef("v1", "ConfigMap", "subject")
    await recorder.record(about, type_="Normal", reason="R", message="m")
    await recorder.record(about, type_="Bogus", reason="R", message="m")
    assert [r.getMessage() for r in caplog.records].count("could not record an event") == 2


async def test_verbs_keep_kubernetes_semantics(kube: KubeClient, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    for i in range(5):
        await kube.create(path, configmap(f"cm{i}", str(i), team="x" if i % 2 else "y"))
    listing = await kube.list(path, page_size=2)
    assert sorted(i["metadata"]["name"] for i in listing.items) == [f"cm{i}" for i in range(5)]
    assert listing.resource_version
    labelled = await kube.list(path, label_selector="team=x")
    assert sorted(i["metadata"]["name"] for i in labelled.items) == ["cm1", "cm3"]
    named = await kube.list(path, field_selector="metadata.name=cm2")
    assert [i["metadata"]["name"] for i in named.items] == ["cm2"]

    with pytest.raises(Conflict):
        await kube.create(path, configmap("cm0"))
    stored = await kube.get(f"{path}/cm0")
    await kube.replace(f"{path}/cm0", {**stored, "data": {"value": "new"}})
    with pytest.raises(Conflict):  # stale resourceVersion
        await kube.replace(f"{path}/cm0", {**stored, "data": {"value": "lost"}})
    with pytest.raises(KubeRejected):  # a failed JSON patch test
        await kube.json_patch(
            f"{path}/cm0", [{"op": "test", "path": "/data/value", "value": "old"}]
        )
    patched = await kube.json_patch(
        f"{path}/cm0",
        [
            {"op": "test", "path": "/data/value", "value": "new"},
            {"op": "replace", "path": "/data/value", "value": "newer"},
        ],
    )
    assert patched["data"]["value"] == "newer"
    with pytest.raises(Conflict):  # a conditional delete of a changed object
        await kube.delete(f"{path}/cm0", resource_version=stored["metadata"]["resourceVersion"])
    assert await kube.delete(f"{path}/cm0")
    assert not await kube.delete(f"{path}/cm0")
    assert await kube.get_or_none(f"{path}/cm0") is None
    with pytest.raises(NotFound):
        await kube.get(f"{path}/cm0")


async def test_an_untrusted_kubeconfig_with_a_token_reaches_the_server(
    control_plane: TestCluster, ns: str
) -> None:
    token = control_plane.service_account_token(ns, "reader", audiences=[control_plane.issuer])
    access = access_from_untrusted_kubeconfig(control_plane.kubeconfig_with_token(token))
    async with KubeClient(access, user_agent="t") as client:
        with pytest.raises(KubeRejected) as caught:  # authenticated, but no RBAC: 403
            await client.get(f"/api/v1/namespaces/{ns}/secrets")
    assert caught.value.status == 403
    assert token not in str(caught.value)


async def test_repeats_within_the_write_interval_are_counted_and_written_once(
    access: ClusterAccess, ns: str
) -> None:
    clock = WallClock()
    calls: Counter[str] = Counter()
    async with KubeClient(access, user_agent="t", on_request=lambda v, s: calls.update([v])) as c:
        recorder = EventRecorder(
            c, namespace=ns, component="c", host="h", clock=clock, min_write_interval=30
        )
        about = ObjectRef("v1", "ConfigMap", "busy", namespace=ns, uid="uid-busy")
        for _ in range(10):  # ten tokens in ten seconds: one create, nothing else yet
            await recorder.record(about, type_="Normal", reason="TokenIssued", message="m")
            clock.now += timedelta(seconds=1)
        assert calls == {"create": 1}
        clock.now += timedelta(seconds=30)
        await recorder.record(about, type_="Normal", reason="TokenIssued", message="m")
        assert calls == {"create": 1, "patch": 1}  # the held-back nine and this one
        await recorder.record(about, type_="Normal", reason="TokenIssued", message="m")
        await recorder.flush()  # what is held back is written on flush (e.g. at shutdown)
        await recorder.flush()  # nothing more to write
        assert calls == {"create": 1, "patch": 2}
        [event] = (await c.list(f"/api/v1/namespaces/{ns}/events")).items
    assert event["count"] == 12


async def test_apply_creates_then_owns_its_fields_and_force_takes_them_from_another_manager(
    kube: KubeClient, ns: str
) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps/applied"
    created = await kube.apply(path, configmap("applied", "one"), field_manager="owner")
    assert created["data"] == {"value": "one"}
    await kube.merge_patch(path, {"data": {"value": "edited", "extra": "x"}})
    # Another manager changed a field the owner applied: without force that is a conflict.
    with pytest.raises(Conflict):
        await kube.apply(path, configmap("applied", "one"), field_manager="owner-2")
    taken = await kube.apply(path, configmap("applied", "one"), field_manager="owner", force=True)
    assert taken["data"] == {"value": "one", "extra": "x"}  # fields it never applied stay
    managers = {m["manager"] for m in taken["metadata"]["managedFields"]}
    assert "owner" in managers
