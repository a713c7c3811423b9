"""Supervision under injected faults: the broker's own parts, in this process, on a real KCP API
server and the Compass simulator; only the fault itself is made up.

- Garbage in the Kyma watch (one line of the real stream corrupted): the informer re-lists and
  goes on; a Kyma created afterwards is in the view; the state readiness reads (`synced`,
  `last_contact`) says fresh; no task had to be restarted.
- A bug (RuntimeError) in a reconcile, raised by Director's unregister once: the worker lives
  on, the name is retried after the backoff, and the runtime is then unregistered and its
  mapping removed.
- A bug that ends a reconcile worker task: the Supervisor reports the task down, counts the
  restart in `broker_task_restarts_total{task}`, starts it again, and the work the dead task
  dropped is picked up (by the sweep): the runtime is unregistered all the same.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane_broker.backoff import backoff
from control_plane_broker.director.graphql_client import DirectorClient
from control_plane_broker.director.oauth import OAuthTokenSource
from control_plane_broker.kube.caches import kyma_informer, mapping_informer
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kyma import KYMA_GROUP, KYMA_VERSION, KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.director_limiter import DirectorLimiter
from control_plane_broker.reconciler.kyma_reconciler import KymaReconciler
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration.service import RegistrationService
from control_plane_broker.registration.state import Mapping
from control_plane_broker.settings import Settings, load_director_credentials
from control_plane_broker.supervisor import Supervisor
from control_plane_broker.wiring import cache_fresh
from devenv.clusters import TestCluster
from kubeapi import ClusterAccess, EventRecorder, Informer, KubeClient, access_from_kubeconfig_file
from tests.integration.kubeapi.conftest import Tamper
from tests.integration.waiting import eventually

FAST = 0.2  # seconds: the watches' re-list delay and the Supervisor's restart delay here


def kymas_path(ns: str) -> str:
    return f"/apis/{KYMA_GROUP}/{KYMA_VERSION}/namespaces/{ns}/kymas"


def kyma(ns: str) -> dict[str, Any]:
    runtime_id = str(uuid.uuid4()).upper()
    name = runtime_id.lower()
    return {
        "apiVersion": f"{KYMA_GROUP}/{KYMA_VERSION}",
        "kind": "Kyma",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                "kyma-project.io/runtime-id": runtime_id,
                "kyma-project.io/global-account-id": f"ga-{uuid.uuid4().hex[:8]}",
                "kyma-project.io/subaccount-id": f"sa-{uuid.uuid4().hex[:8]}",
                "kyma-project.io/shoot-name": f"c-{uuid.uuid4().hex[:7]}",
                "operator.kyma-project.io/kyma-name": name,
            },
        },
        "spec": {"channel": "regular", "modules": [{"name": "application-connector"}]},
    }


def restarts(metrics: Metrics) -> dict[str, float]:
    """`broker_task_restarts_total` by task, as Prometheus would scrape it."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "broker_task_restarts_total":
                out[sample.labels["task"]] = sample.value
    return out


@pytest.fixture
def access(control_plane: TestCluster) -> ClusterAccess:
    return access_from_kubeconfig_file(control_plane.kubeconfig_path)


@pytest.fixture
async def kcp(access: ClusterAccess) -> AsyncIterator[KubeClient]:
    async with KubeClient(access, user_agent="chaos-tests") as client:
        yield client


class Watched(Supervisor):
    """The Supervisor as wiring.run sets it up (restarts counted in the metric); also notes
    which tasks it reported down at each restart, as /readyz would have read them."""

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(on_restart=self._restarting, delay=lambda n: FAST)
        self._metrics = metrics
        self.down_at_restart: list[list[str]] = []

    def _restarting(self, task: str) -> None:
        self._metrics.task_restarts.labels(task).inc()
        self.down_at_restart.append(self.down())


@asynccontextmanager
async def supervised(metrics: Metrics) -> AsyncIterator[Watched]:
    supervisor = Watched(metrics)
    try:
        yield supervisor
    finally:
        await supervisor.stop()


# --- (a) garbage in the Kyma watch ------------------------------------------------------------


async def test_garbage_in_the_kyma_watch_is_survived_and_readiness_stays_right(
    access: ClusterAccess, kcp: KubeClient, kcp_ns: str
) -> None:
    tamper = Tamper(access)
    tamper.garble_watch = 1  # the first watch stream gets one garbage line after its first event
    metrics = Metrics()
    async with (
        KubeClient(access, user_agent="chaos-tests", transport=tamper) as tampered,
        supervised(metrics) as supervisor,
    ):
        kymas = kyma_informer(tampered, namespace=kcp_ns, delay=lambda n: FAST)
        supervisor.start("kyma-watch", kymas.run)
        await eventually(lambda: kymas.synced, within=10, what="kymas synced")

        before = await kcp.create(kymas_path(kcp_ns), kyma(kcp_ns))  # its event, then garbage
        garbage_sent = time.monotonic()
        await eventually(lambda: tamper.tampered == 1, what="the garbled watch line")
        await eventually(lambda: kymas.relists >= 2, what="a re-list after the garbage")
        after = await kcp.create(kymas_path(kcp_ns), kyma(kcp_ns))
        await eventually(
            lambda: kymas.get(after["metadata"]["name"]), what="a Kyma created after the garbage"
        )

        assert kymas.get(before["metadata"]["name"]) is not None
        # What /readyz decides on: synced, and heard from the API server since the garbage.
        assert kymas.synced
        assert kymas.last_contact is not None
        assert kymas.last_contact > garbage_sent
        assert cache_fresh(kymas, 5.0)
        # The informer handled it itself: the task never ended, nothing was restarted.
        assert supervisor.down() == []
        assert restarts(metrics) == {}


# --- (b) a bug inside a reconcile, and a bug that ends a worker ------------------------------


class UnregisterRaisesOnce:
    """The real DirectorClient; its first `unregister_runtime` raises a bug-like error."""

    def __init__(self, inner: DirectorClient) -> None:
        self._inner = inner
        self.calls: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def unregister_runtime(self, *, tenant: str, runtime_id: str) -> bool:
        self.calls.append(time.monotonic())
        if len(self.calls) == 1:
            raise RuntimeError("injected: a bug on the unregister path")
        return await self._inner.unregister_runtime(tenant=tenant, runtime_id=runtime_id)


class LeadershipCheckRaisesOnceInAWorker:
    """Always leading; once armed, the next check made by a reconcile worker raises, which ends
    that worker's task (the check runs outside the per-name error handling)."""

    def __init__(self) -> None:
        self.armed = False
        self.raised_in: list[str] = []

    def __call__(self) -> bool:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        if self.armed and name.startswith("reconcile-"):
            self.armed = False
            self.raised_in.append(name)
            raise RuntimeError("injected: the leadership check failed")
        return True


@dataclass
class Plant:
    """The broker's parts on a real KCP namespace and the simulator, as wiring.run builds them."""

    ns: str
    kcp: KubeClient
    kymas: Informer[KymaView]
    mappings: Informer[Mapping]
    repo: MappingRepository
    director: DirectorClient
    registration: RegistrationService
    events: KymaEvents
    status: StatusRecorder
    settings: Settings
    metrics: Metrics

    def reconciler(self, *, director: Any, leading: Callable[[], bool]) -> KymaReconciler:
        return KymaReconciler(
            settings=self.settings.reconciler_settings(),
            cache=self.kymas,
            mappings=self.mappings,
            repo=self.repo,
            director=director,
            registration=self.registration,
            events=self.events,
            status=self.status,
            metrics=self.metrics,
            leading=leading,
            clock=time.time,
        )

    async def registered_runtime(self) -> KymaView:
        """A Kyma, registered in Director through the real registration path."""
        created = await self.kcp.create(kymas_path(self.ns), kyma(self.ns))
        name = created["metadata"]["name"]
        view = await eventually(lambda: self.kymas.get(name), what="the Kyma in the view")
        registered = await self.registration.ensure_registered(view)
        assert registered.outcome == "registered"
        await eventually(
            lambda: (m := self.mappings.get(name)) is not None and m.compass_id,
            what="the recorded mapping in the view",
        )
        return view

    async def delete_kyma(self, name: str) -> None:
        assert await self.kcp.delete(f"{kymas_path(self.ns)}/{name}")


@pytest.fixture
async def plant(
    kcp: KubeClient, kcp_ns: str, sim: Any, creds_file: Path
) -> AsyncIterator[tuple[Plant, Watched]]:
    settings = Settings(
        director_url=sim.director_url,
        director_credentials_file=creds_file,
        kcp_namespace=kcp_ns,
        lease_namespace=kcp_ns,
        director_timeout_seconds=3,
        sweep_interval_seconds=1,
    )
    metrics = Metrics()
    kymas = kyma_informer(kcp, namespace=kcp_ns, delay=lambda n: FAST)
    mappings = mapping_informer(kcp, namespace=kcp_ns, delay=lambda n: FAST)
    repo = MappingRepository(kcp, namespace=kcp_ns)
    events = KymaEvents(
        EventRecorder(kcp, namespace=kcp_ns, component="compass-broker", host="chaos"),
        namespace=kcp_ns,
    )
    status = StatusRecorder(repo=repo, cache=mappings, events=events, clock=time.time)
    clients = [httpx.AsyncClient(timeout=3, trust_env=False) for _ in range(2)]
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=5, open_seconds=1),
        max_concurrency=4,
        queue_timeout=5,
        clock=time.monotonic,
    )
    oauth = OAuthTokenSource(
        clients[1],
        load_director_credentials(creds_file),
        scope=settings.director_scope,
        clock=time.monotonic,
    )
    director = DirectorClient(http=clients[0], url=sim.director_url, oauth=oauth, limiter=limiter)
    registration = RegistrationService(
        settings=settings.registration_settings(),
        repo=repo,
        cache=mappings,
        director=director,
        metrics=metrics,
        me="chaos",
        clock=time.time,
        watch=mappings,
    )
    parts = Plant(
        kcp_ns,
        kcp,
        kymas,
        mappings,
        repo,
        director,
        registration,
        events,
        status,
        settings,
        metrics,
    )
    async with supervised(metrics) as supervisor:
        supervisor.start("kyma-watch", kymas.run)
        supervisor.start("mapping-watch", mappings.run)
        await eventually(lambda: kymas.synced, within=10, what="kymas synced")
        await eventually(lambda: mappings.synced, within=10, what="mappings synced")
        try:
            yield parts, supervisor
        finally:
            await events.drain()
            for client in clients:
                await client.aclose()


async def test_a_bug_in_a_reconcile_is_retried_with_backoff_and_the_runtime_unregistered(
    plant: tuple[Plant, Watched], sim: Any
) -> None:
    parts, supervisor = plant
    view = await parts.registered_runtime()
    assert view.tenant is not None
    [runtime] = sim.runtimes(view.tenant)
    director = UnregisterRaisesOnce(parts.director)
    reconciler = parts.reconciler(director=director, leading=lambda: True)
    for index in range(2):
        supervisor.start(f"reconcile-{index}", reconciler.run_worker)

    await parts.delete_kyma(view.name)
    await eventually(lambda: not sim.runtimes(view.tenant), what="the runtime unregistered")
    await eventually(lambda: parts.mappings.get(view.name) is None, what="the mapping removed")

    assert len(director.calls) == 2  # the failed call, then the retry that unregistered
    assert director.calls[1] - director.calls[0] >= backoff(1) - 0.05  # after the backoff
    assert await parts.repo.get(view.name) is None
    assert runtime.id not in {r.id for r in sim.runtimes()}
    # The error stayed inside the reconcile: no worker ended, nothing was restarted.
    assert supervisor.down() == []
    assert restarts(parts.metrics) == {}


async def test_a_worker_that_dies_is_restarted_counted_and_its_work_done(
    plant: tuple[Plant, Watched], sim: Any
) -> None:
    parts, supervisor = plant
    view = await parts.registered_runtime()
    assert view.tenant is not None
    leading = LeadershipCheckRaisesOnceInAWorker()
    reconciler = parts.reconciler(director=parts.director, leading=leading)
    for index in range(2):
        supervisor.start(f"reconcile-{index}", reconciler.run_worker)
    supervisor.start("sweep", reconciler.run_sweeps)

    leading.armed = True
    await parts.delete_kyma(view.name)
    # A worker died on its next leadership check (with the name it had just taken) ...
    await eventually(lambda: leading.raised_in, what="the injected failure")
    [dead] = leading.raised_in
    await eventually(lambda: restarts(parts.metrics) == {dead: 1.0}, what="the restart counted")
    assert supervisor.down_at_restart == [[dead]]  # readiness saw it down until it restarted
    # ... was started again, and the name it dropped was queued again by the sweep.
    await eventually(lambda: not sim.runtimes(view.tenant), what="the runtime unregistered")
    await eventually(lambda: parts.mappings.get(view.name) is None, what="the mapping removed")
    await eventually(lambda: supervisor.down() == [], what="every task running again")
    assert restarts(parts.metrics) == {dead: 1.0}
