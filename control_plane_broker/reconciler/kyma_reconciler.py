"""The leader's Kyma reconciler: unregisters runtimes whose Kyma is gone, syncs Director labels, and
judges every runtime's connection health periodically (stale reports, no connection after a
token: `report_rules.check`, written only on change).

A mapping is bookkeeping, not the runtime: deleting it while its Kyma exists does not unregister
the runtime. The leader lets the deletion go and records the runtime again on a new mapping
(re-adopted, if Director still has it). Dropping a runtime from Compass while its Kyma exists is
an explicit operator action: the annotation `compass-broker.kyma-project.io/unregister`.

Level-based: a watch event (Kyma or mapping) or the periodic sweep only queues a Kyma name;
reconciling plans on the watch-fed views (`plan` is pure) and, before it acts, re-reads the
mapping from the API server and plans again, so nothing is unregistered on a stale view. Several
workers share the queue; one name is never reconciled by two workers at once. Holds:
- a mapping is removed only after its runtime is unregistered (not found counts as done), so a
  runtime is never orphaned by the broker; the finalizer `kyma-project.io/cm-protection` keeps
  anyone else from removing the mapping first;
- while a live claim exists (a registration in flight) nothing is removed;
- only the leader acts; failures retry per key with exponential backoff.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from control_plane_broker.backoff import backoff
from control_plane_broker.connections import report_rules
from control_plane_broker.connections.report_service import report_limits
from control_plane_broker.director.classification import DirectorInternal, DirectorPermanent
from control_plane_broker.director.graphql_client import DirectorApi
from control_plane_broker.errors import BrokerError, KymaIncomplete
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kyma import LABEL_SHOOT, KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.policy import module_enabled
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration import naming, state
from control_plane_broker.registration.service import (
    MappingReader,
    Registered,
    RegistrationService,
)
from control_plane_broker.registration.state import Mapping
from control_plane_broker.settings import ReconcilerSettings
from kubeapi import Conflict, Informer, KubeError

# The name it logged under before it moved into its package: log lines stay as they were.
log = logging.getLogger("control_plane_broker.kyma_reconciler")

CHECK_BATCH = 200  # mappings judged between two yields to the event loop


@dataclass(frozen=True)
class Unregister:
    reason: str  # kyma-deleted | module-disabled | operator


@dataclass(frozen=True)
class Release:
    """The mapping is being deleted while its Kyma lives: let it go, keep the runtime."""


@dataclass(frozen=True)
class SyncLabels:
    changes: dict[str, str]
    desired: dict[str, str]


@dataclass(frozen=True)
class Requeue:
    after: float


@dataclass(frozen=True)
class Nothing:
    pass


Action = Unregister | Release | SyncLabels | Requeue | Nothing


def plan(  # noqa: PLR0911 - the ordered rules
    mapping: Mapping,
    kyma: KymaView | None,
    *,
    now: float,
    module: str,
    module_required: bool,
    disabled_policy: str,
    desired_labels: dict[str, str] | None,
) -> Action:
    if mapping.claim_holder and (mapping.claim_expires or 0.0) > now:
        return Requeue(after=(mapping.claim_expires or now) - now + 0.5)
    if kyma is None or kyma.deleting:
        return Unregister("kyma-deleted")
    if mapping.unregister is not None:
        return Unregister("operator")
    if mapping.deleting:
        return Release()
    if mapping.revoked is not None and not mapping.compass_id:
        # Kept after an unregistration only to hold the revocation (`_keep_revoked`): with no
        # runtime recorded, there is nothing to unregister or label until the Kyma goes.
        return Nothing()
    if module_required and disabled_policy == "unregister" and not module_enabled(kyma, module):
        return Unregister("module-disabled")
    if mapping.compass_id and desired_labels is not None:
        changes = naming.label_changes(desired_labels, mapping.director_labels)
        if changes:
            return SyncLabels(changes=changes, desired=desired_labels)
    return Nothing()


class KymaReconciler:
    def __init__(
        self,
        *,
        settings: ReconcilerSettings,
        cache: Informer[KymaView],
        mappings: Informer[Mapping],
        repo: MappingRepository,
        director: DirectorApi,
        registration: RegistrationService,
        events: KymaEvents,
        status: StatusRecorder,
        metrics: Metrics,
        leading: Callable[[], bool],
        clock: Callable[[], float],
    ) -> None:
        self._s = settings
        self._cache = cache
        self._mappings: MappingReader = mappings
        self._mapping_view = mappings
        self._repo = repo
        self._director = director
        self._registration = registration
        self._events = events
        self._metrics = metrics
        self._leading = leading
        self._clock = clock
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._failures: dict[str, int] = {}
        self._busy: set[str] = set()  # being reconciled by a worker
        self._dirty: set[str] = set()  # changed while busy: reconcile again after
        self._status = status
        cache.add_listener(self.enqueue)
        mappings.add_listener(self.enqueue)

    def enqueue(self, name: str) -> None:
        if name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def _enqueue_later(self, name: str, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.enqueue, name)

    async def sweep(self) -> None:
        """Queues every mapping: finds those whose Kyma vanished while no broker ran."""
        for mapping in await self._repo.list():
            self.enqueue(mapping.name)

    async def run_sweeps(self) -> None:
        was_leading = False
        next_sweep = 0.0
        while True:
            leading = self._leading()
            if leading and self._cache.synced and (not was_leading or self._clock() >= next_sweep):
                try:
                    await self.sweep()
                except KubeError as exc:
                    log.warning("sweep failed", extra={"error": str(exc)})
                next_sweep = self._clock() + self._s.sweep_interval_seconds
            was_leading = leading and self._cache.synced
            await asyncio.sleep(0.5)

    async def run_connection_checks(self) -> None:
        """Every BROKER_CONNECTION_CHECK_INTERVAL_SECONDS, while leading: `check_connections`."""
        while True:
            await asyncio.sleep(self._s.connection_check_interval_seconds)
            if self._leading() and self._cache.synced and self._mapping_view.synced:
                await self.check_connections()

    async def check_connections(self) -> int:
        """Judges every mapping of the view; writes (and tells) only what changed. Returns the
        number of mappings written. A mapping that cannot be written now is tried again at the
        next check: the judgement is level-based, nothing is lost by skipping one."""
        limits = report_limits(self._s.reports)
        written = 0
        for index, mapping in enumerate(self._mapping_view.values()):
            if index % CHECK_BATCH == CHECK_BATCH - 1:
                await asyncio.sleep(0)
            if await self._judge_connection(mapping, limits):
                written += 1
        return written

    async def _judge_connection(self, mapping: Mapping, limits: report_rules.Limits) -> bool:
        """`report_rules.check` on one mapping of the view, written when it changes anything."""
        if mapping.deleting:
            return False
        judge = functools.partial(report_rules.check, now=self._clock(), limits=limits)
        if judge(mapping) is None:
            return False  # the common case: decided on the view, no request
        kyma = self._cache.get(mapping.name)
        try:
            return await self._status.apply_change(
                mapping, judge, kyma_uid=kyma.uid if kyma is not None else ""
            )
        except KubeError as exc:
            log.warning(
                "connection check not written", extra={"kyma": mapping.name, "error": str(exc)}
            )
            return False

    async def run_worker(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            if not self._leading() or not self._cache.synced or not self._mapping_view.synced:
                continue  # the leader's first sweep covers whatever is skipped here
            if name in self._busy:
                self._dirty.add(name)
                continue
            self._busy.add(name)
            try:
                await self._reconcile_once(name)
            finally:
                self._busy.discard(name)
                if name in self._dirty:
                    self._dirty.discard(name)
                    self.enqueue(name)

    async def _reconcile_once(self, name: str) -> None:
        try:
            await self.reconcile(name)
            self._failures.pop(name, None)
        except Exception as exc:
            # Expected failures (Director, KCP) and bugs alike: this name is retried with
            # backoff, the worker goes on with the others.
            count = self._failures.get(name, 0) + 1
            self._failures[name] = count
            delay = backoff(count)
            expected = isinstance(exc, BrokerError | KubeError)
            log.log(
                logging.WARNING if expected else logging.ERROR,
                "reconcile failed, retrying",
                extra={
                    "kyma": name,
                    "error": str(exc) if expected else type(exc).__name__,
                    "retry_in": delay,
                },
                exc_info=not expected,
            )
            self._enqueue_later(name, delay)

    async def reconcile(self, name: str) -> None:
        viewed = self._mappings.get(name)
        if viewed is None:
            await self._readopt(name)
            return
        match self._plan(viewed):
            case Nothing():
                # The common case, decided on the watch-fed view without a request. A changed
                # mapping (revoked, or lifted) is judged at once, not at the next periodic check.
                await self._judge_connection(viewed, report_limits(self._s.reports))
                return
            case Requeue(after=after):
                # A registration in flight: nothing to act on, so nothing to read either (its
                # record arrives by the watch and queues the name again).
                self._enqueue_later(name, after)
                return
        mapping = await self._repo.get(name)  # acting: on the current object only
        if mapping is None:
            return
        kyma = self._cache.get(name)
        action = self._plan(mapping)
        await self._act(action, mapping, kyma)

    def _plan(self, mapping: Mapping) -> Action:
        kyma = self._cache.get(mapping.name)
        desired = (
            naming.director_labels(
                kyma,
                managed_by=self._s.managed_by_label_value,
                runtime_id_label=self._s.runtime_id_label,
            )
            if kyma is not None
            else None
        )
        return plan(
            mapping,
            kyma,
            now=self._clock(),
            module=self._s.module.module_name,
            module_required=self._s.module.module_required,
            disabled_policy=self._s.module.module_disabled_policy,
            desired_labels=desired,
        )

    async def _act(self, action: Action, mapping: Mapping, kyma: KymaView | None) -> None:
        name = mapping.name
        match action:
            case Requeue(after=after):
                self._enqueue_later(name, after)
            case Unregister(reason=reason):
                try:
                    await self._unregister(mapping, kyma, reason)
                except (BrokerError, KubeError) as exc:
                    await self._failed(
                        mapping,
                        kyma,
                        condition="Unregistered",
                        event_reason="UnregisterFailed",
                        exc=exc,
                        what=f"unregister ({reason})",
                    )
                    raise
            case Release():
                # The deletion goes on; the mapping's disappearance brings `_readopt`.
                await self._remove(mapping)
            case SyncLabels(changes=changes, desired=desired_now):
                try:
                    await self._sync_labels(mapping, kyma, changes, desired_now)
                except (BrokerError, KubeError) as exc:
                    await self._failed(
                        mapping,
                        kyma,
                        condition="LabelsSynced",
                        event_reason="LabelSyncFailed",
                        exc=exc,
                        what="label sync",
                    )
                    raise
            case Nothing():
                pass

    async def _failed(
        self,
        mapping: Mapping,
        kyma: KymaView | None,
        *,
        condition: str,
        event_reason: str,
        exc: BaseException,
        what: str,
    ) -> None:
        """The failure lands on the mapping as a condition (written only when it changed) and,
        when new, as a Warning Event; the finalizer stays, so the mapping survives until done."""
        await self._status.failed(
            kyma=kyma,
            name=mapping.name,
            condition=condition,
            event_reason=event_reason,
            exc=exc,
            mapping=mapping,
            what=what,
        )

    async def _readopt(self, name: str) -> None:
        """A mapping seen to go (deleted, or force-deleted by an operator) while its Kyma lives:
        the runtime it recorded is found in Director and recorded on a new mapping, so the Kyma's
        deletion later unregisters it (no orphan). Nothing found: it was never registered, and
        its next token request looks it up before registering."""
        kyma = self._cache.get(name)
        if kyma is None or kyma.deleting or not kyma.tenant:
            return
        if not self._registration.vanished(name) or self._mappings.get(name) is not None:
            return
        found = await self._registration.find(kyma, kyma.tenant)
        if found is None:
            return
        try:
            await self._repo.create(
                state.adopted_mapping(kyma, namespace=self._s.kcp_namespace, compass_id=found.id)
            )
        except Conflict:
            return  # a token request recorded it first
        log.info(
            "mapping gone, runtime adopted again", extra={"kyma": name, "compass_id": found.id}
        )
        await self._events.record(
            kyma_name=name,
            kyma_uid=kyma.uid,
            reason="MappingReplaced",
            message=f"the mapping was deleted while the Kyma exists: Compass runtime {found.id} "
            f"is kept and recorded on a new mapping (to drop a runtime from Compass, annotate its "
            f"mapping with {state.ANNOTATION_UNREGISTER})",
        )

    async def _remove(self, mapping: Mapping) -> None:
        """Takes our finalizer off and deletes the mapping (both with the version read)."""

        async def remove(current: Mapping) -> None:
            if state.FINALIZER in current.finalizers:
                await self._repo.replace(state.without_finalizer(current))
            await self._repo.delete(mapping.name)

        await self._on_current(mapping, remove, doing="removing it")

    async def _on_current(
        self, mapping: Mapping, write: Callable[[Mapping], Awaitable[None]], *, doing: str
    ) -> None:
        """`write` on the mapping as read, again on the current one after a conflict; nothing
        once the mapping is gone."""
        current = mapping
        for _ in range(5):
            try:
                await write(current)
                return
            except Conflict:
                fresh = await self._repo.get(mapping.name)
                if fresh is None:
                    return
                current = fresh
        raise Conflict(f"mapping kept changing while {doing}")

    async def _unregister(self, mapping: Mapping, kyma: KymaView | None, reason: str) -> None:
        tenant = mapping.tenant or (kyma.tenant if kyma else None)
        ids = [mapping.compass_id] if mapping.compass_id else []
        if not ids and tenant:
            # Never recorded: a crashed registration (ours, or compass-manager's) may still have
            # created it. Find it the way registration would have: by the runtime ID as written
            # on the Kyma (kept on the mapping, so it is known after the Kyma is gone), then by
            # compass-manager's gardenerClusterName.
            runtime_id = mapping.runtime_id or (kyma.runtime_id if kyma else mapping.name)
            found = await self._director.runtimes_by_label(
                tenant=tenant, key=self._s.runtime_id_label, value=runtime_id
            )
            shoot = mapping.shoot or (kyma.labels.get(LABEL_SHOOT) if kyma else None)
            if not found and shoot:
                found = await self._director.runtimes_by_label(
                    tenant=tenant, key="gardenerClusterName", value=shoot
                )
            ids = sorted({r.id for r in found})
        if ids and not tenant:
            # Retried with backoff and shown on the mapping: a person has to add the label.
            raise KymaIncomplete("the mapping has no global account label to unregister with")
        for compass_id in ids:
            assert tenant is not None
            removed = await self._director.unregister_runtime(tenant=tenant, runtime_id=compass_id)
            log.info(
                "unregistered runtime",
                extra={
                    "kyma": mapping.name,
                    "compass_id": compass_id,
                    "reason": reason,
                    "existed": removed,
                },
            )
            self._metrics.unregistrations.labels(reason).inc()
        await self._events.record(
            kyma_name=mapping.name,
            kyma_uid=kyma.uid if kyma else "",
            reason="RuntimeUnregistered",
            message=f"unregistered from Compass ({reason})",
        )
        if mapping.revoked is not None and kyma is not None and not kyma.deleting:
            await self._keep_revoked(mapping)
        else:
            await self._remove(mapping)

    async def _keep_revoked(self, mapping: Mapping) -> None:
        """A revoked runtime unregistered while its Kyma lives (module disabled, an operator's
        request) keeps its mapping: whoever can switch the module off and on again must not lift
        the revocation with it."""

        async def keep(current: Mapping) -> None:
            await self._repo.replace(state.unregistered_but_revoked(current))

        await self._on_current(mapping, keep, doing="keeping its revocation")

    async def _sync_labels(
        self,
        mapping: Mapping,
        kyma: KymaView | None,
        changes: dict[str, str],
        desired: dict[str, str],
    ) -> None:
        tenant = mapping.tenant or (kyma.tenant if kyma else None)
        compass_id = mapping.compass_id
        assert compass_id is not None
        if not tenant:
            return
        try:
            for key, value in changes.items():
                await self._director.set_runtime_label(
                    tenant=tenant, runtime_id=compass_id, key=key, value=value
                )
                self._metrics.labels_synced.inc()
        except (DirectorPermanent, DirectorInternal):
            # Director answers code 10 for a label on a missing runtime: that runtime may have
            # been unregistered behind our back. Then there is nothing to label; the next token
            # request registers it again.
            if not await self._registration.is_gone(Registered(compass_id, tenant, "adopted")):
                raise
            _, forgotten = await self._registration.forget(mapping.name, compass_id)
            if forgotten and kyma is not None:
                await self._status.runtime_lost(kyma=kyma, compass_id=compass_id)
            return
        await self._status.labels_synced(mapping, written=len(changes), desired=desired)
        log.info("director labels synced", extra={"kyma": mapping.name, "keys": sorted(changes)})
