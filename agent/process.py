"""The agent process: wires the agent together from its settings and runs it until asked to stop
(its watches, lease, reconcile loop, and the health and metrics server).

Always holds: one KubeClient and one BrokerClient per process, created here and closed here;
the informers (watches that only wake the reconcile loop), the leader elector, the health
server and the reconcile loop are tasks of `run()` and all end (cancelled and awaited) before
`run()` returns — nothing is left running after a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from agent.broker_client import BrokerClient, tls_context
from agent.credentials import Identity, MtlsIdentity, ServiceAccountIdentity, token_requester
from agent.discovery import CONFIGMAP_NAME
from agent.health import HealthServer
from agent.kube import resources
from agent.kube.event_reasons import COMPONENT
from agent.metrics import AgentMetrics
from agent.reconcile import Reconciler
from agent.retry_policy import RandomSource, next_delay
from agent.settings import AgentSettings, IdentityMode, ModuleSignal, split_address
from kubeapi import (
    JSON,
    EventRecorder,
    Informer,
    KubeClient,
    LeaderElector,
    access_from_kubeconfig_file,
    in_cluster_access,
)

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Overrides:
    """Test seams: transports and clocks to plug in instead of the real ones."""

    broker_transport: httpx.AsyncBaseTransport | None = None
    kube_transport: httpx.AsyncBaseTransport | None = None
    clock: Callable[[], datetime] = utcnow
    rng: RandomSource | None = None
    extra: dict[str, object] = field(default_factory=dict)


class Agent:
    def __init__(self, settings: AgentSettings, *, overrides: Overrides | None = None) -> None:
        self.settings = settings
        o = overrides or Overrides()
        access = (
            access_from_kubeconfig_file(settings.kubeconfig)
            if settings.kubeconfig
            else in_cluster_access()
        )
        # Four watches hold a connection each; the reconcile turn, the lease, Events and a
        # TokenRequest share the rest.
        self.kube = KubeClient(
            access, user_agent=COMPONENT, max_connections=10, transport=o.kube_transport
        )
        self.metrics = AgentMetrics()
        self.identity_name = settings.identity or os.environ.get("HOSTNAME") or socket.gethostname()
        identity: Identity
        if settings.identity_mode is IdentityMode.MTLS:
            assert settings.client_cert_file is not None  # the settings check made sure
            assert settings.client_key_file is not None
            verify = tls_context(ca_bundle=settings.broker_ca_bundle)
            identity = MtlsIdentity(
                context=verify,
                cert_file=settings.client_cert_file,
                key_file=settings.client_key_file,
            )
        else:
            identity = ServiceAccountIdentity(
                token_file=settings.sa_token_file,
                requester=token_requester(
                    self.kube,
                    namespace=settings.service_account_namespace or settings.namespace,
                    service_account=settings.service_account,
                    audience=settings.audience,
                    seconds=settings.token_request_seconds,
                    clock=o.clock,
                ),
                clock=o.clock,
            )
            verify = tls_context(ca_bundle=settings.broker_ca_bundle)
        self.broker = BrokerClient(
            base_url=settings.broker_base,
            identity=identity,
            policy=settings.retry_policy,
            timeout=settings.broker_timeout,
            verify=verify,
            transport=o.broker_transport,
            clock=o.clock,
            rng=o.rng,
        )
        self.events = EventRecorder(
            self.kube,
            namespace=settings.namespace,
            component=COMPONENT,
            host=self.identity_name,
            clock=o.clock,
        )
        self.reconciler = Reconciler(
            settings=settings,
            kube=self.kube,
            broker=self.broker,
            events=self.events,
            metrics=self.metrics,
            clock=o.clock,
            rng=o.rng,
        )
        self.watchers = self._watchers(o.rng)
        # The reconcile loop waits on these; the elector flips them (`standby` = not leading).
        self.leading = asyncio.Event()
        self.standby = asyncio.Event()
        self.standby.set()
        self.lease = (
            LeaderElector(
                self.kube,
                namespace=settings.namespace,
                name=settings.lease_name,
                identity=self.identity_name,
                duration=settings.lease_duration,
                renew_every=settings.lease_renew,
                on_change=self._leadership_changed,
            )
            if settings.lease_enabled
            else None
        )
        host, port = split_address(settings.health_address)
        self.health = HealthServer(
            host=host,
            port=port,
            registry=self.metrics.registry,
            healthy=self.healthy,
            ready=self.ready,
        )
        self.started = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _leadership_changed(self, leading: bool) -> None:
        (self.leading if leading else self.standby).set()
        (self.standby if leading else self.leading).clear()

    def _watchers(self, rng: RandomSource | None) -> list[Informer[JSON]]:
        """Watches that only wake the reconcile loop, which re-reads what it needs."""
        s = self.settings
        policy = s.retry_policy

        def watch(path: str, name: str, *, only: str | None = None) -> Informer[JSON]:
            informer: Informer[JSON] = Informer(
                self.kube,
                path,
                name=name,
                parse=dict,
                delay=lambda failures: next_delay(policy, failures, rng=rng),
                field_selector=f"metadata.name={only}" if only else None,
                # A kind whose CRD is not installed (yet) is empty, not a reason to wait.
                missing_kind_is_empty=True,
            )
            informer.add_listener(lambda _name: self.reconciler.trigger())
            return informer

        watchers = [
            watch(resources.kymas(s.namespace), "kyma", only=s.kyma_name),
            watch(resources.secrets(s.namespace), "secret", only=s.secret_name),
            watch(resources.configmaps(s.namespace), "configmap", only=CONFIGMAP_NAME),
            watch(
                resources.compass_connections(),
                "compassconnection",
                only=resources.COMPASS_CONNECTION_NAME,
            ),
        ]
        if ModuleSignal.APPLICATIONCONNECTOR_CR in s.module_signals:
            watchers.append(
                watch(resources.application_connectors(s.namespace), "applicationconnector")
            )
        return watchers

    def healthy(self) -> bool:
        # A watcher or the lease keeper only ends by dying: the agent would then be deaf (or
        # never renew), which a liveness probe should answer with a restart.
        return self.reconciler.alive and not any(t.done() for t in self._tasks)

    def ready(self) -> tuple[bool, str]:
        """What lifecycle-manager shows as the module state (the Deployment's readiness)."""
        # Until every watch has listed once the agent knows too little to act.
        unsynced = [w.name for w in self.watchers if not w.synced]
        if unsynced:
            return False, f"watches not synced: {', '.join(unsynced)}"
        if self.lease is not None and not self.leading.is_set():
            if not self.lease.decided:
                # Not a standby yet: ready now would flip to "no reconcile turn yet" the
                # moment the lease turns out to be ours.
                return False, "lease not tried yet"
            # A standby is as ready as it should be: it takes over when the leader goes.
            return self.reconciler.alive, "standby: another agent holds the lease"
        return self.reconciler.readiness()

    async def run(self, stop: asyncio.Event) -> None:
        await self.health.start()
        tasks = [asyncio.create_task(w.run(), name=f"watch-{w.name}") for w in self.watchers]
        self._tasks = tasks
        leading = standby = None
        if self.lease is not None:
            tasks.append(asyncio.create_task(self.lease.run(), name="lease"))
            leading, standby = self.leading, self.standby
        loop = asyncio.create_task(
            self.reconciler.run(stop, leading=leading, standby=standby), name="reconcile"
        )
        self.started.set()
        log.info(
            "agent started",
            extra={"namespace": self.settings.namespace, "health_port": self.health.port},
        )
        try:
            await _wait_first(loop, asyncio.create_task(_wait_set(stop)))
        finally:
            stop.set()
            loop.cancel()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(loop, *tasks, return_exceptions=True)
            if self.lease is not None:
                await self.lease.release()
            await self.health.stop()
            await self.broker.aclose()
            await self.kube.aclose()
            log.info("agent stopped")
        if loop.done() and not loop.cancelled() and loop.exception() is not None:
            raise RuntimeError("the reconcile loop died") from loop.exception()


async def _wait_first(*tasks: asyncio.Task[None]) -> None:
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _wait_set(event: asyncio.Event) -> None:
    await event.wait()
