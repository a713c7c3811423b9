"""Carries out the registration decisions of `registration.state` against KCP and Director.

Order that makes it exactly-once (see `state` for the invariants):
claim the mapping → register → record the Compass runtime ID on the mapping (and release the
claim) before anything else uses it. Director is searched first (by our label, then by
compass-manager's) unless nobody can have registered the runtime:

- a mapping this process *created* for a Kyma that is certainly new (`state.certainly_new`:
  created after our mapping watch listed, and no mapping of that name seen to go) had no
  registration behind it, and we register nothing without holding the claim, so nobody can have
  registered this Kyma as long as every attempt of ours failed before its request left (no
  access token, no connection, the breaker) and the claim still names us when we take it again
  after it lapsed (every taker writes its own name): no lookup (the hot path of a new runtime
  costs exactly `registerRuntime`, also after an outage longer than the claim). A missing
  mapping alone proves nothing: an operator may have force-deleted it, and a broker that
  restarted since did not see that;
- a mapping that existed without a Compass ID (compass-manager creates its mapping before it
  registers; a broker that crashed or lost Director's answer leaves its claim) may have a
  registration behind it: it is looked up before registering;
- an answer to `registerRuntime` that does not prove nothing was written (Director's internal
  error, which a failed `COMMIT` also gives; an answer lost; `classification.may_have_written`)
  is treated as a lost one: the next attempt looks the runtime up first. A look-up that finds
  nothing, under our claim, proves nothing is registered until our next call: the attempts
  after it register without looking again, so each uncertain answer costs one look-up.

The claim is renewed by its holder when it would expire before a Director call could end, so a
slow Director never hands the claim to another replica in the middle of a registration.

Director's refusals that only a change elsewhere can lift are remembered on the mapping, so
asking again costs Director nothing: an unknown global account or subaccount
(`status.compassRefusal`, until the Kyma names other tenants or the recheck period passes). A
runtime Director shows gone (unregistered behind our back) is forgotten on the mapping and
registered again, once, after a look-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from control_plane_broker.director.answers import DirectorRuntime, RuntimeRegisterInput
from control_plane_broker.director.classification import (
    INVALID_OPERATION,
    DirectorPermanent,
    DirectorTenantUnknown,
    may_have_written,
)
from control_plane_broker.director.graphql_client import DirectorApi
from control_plane_broker.errors import (
    CompassTenantUnknown,
    ControlPlaneUnavailable,
    KymaDeleting,
    KymaIncomplete,
    RegistrationBusy,
)
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kyma import LABEL_GLOBAL_ACCOUNT, LABEL_SHOOT, LABEL_SUBACCOUNT, KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload.reservations import Reservation
from control_plane_broker.registration import naming, state
from control_plane_broker.registration.state import Mapping
from control_plane_broker.settings import RegistrationSettings
from control_plane_broker.singleflight import SingleFlight
from kubeapi import Conflict, KubeError

log = logging.getLogger(__name__)

MAX_ROUNDS = 8
WAIT_FOR_OTHER_SECONDS = 3.0


class MappingReader(Protocol):
    """The watch-fed view of the mappings: may lag, never decides alone what gets written."""

    def get(self, name: str) -> Mapping | None: ...


class MappingWatch(MappingReader, Protocol):
    """The mapping informer, as `certainly_new` needs it: when it last listed (wall clock),
    and a listener for every name that changed."""

    @property
    def listed_at(self) -> float | None: ...

    def add_listener(self, listener: Callable[[str], None], /) -> None: ...


# Names of mappings seen to go, kept to tell a force-deleted mapping from one that never was.
# When it overflows, it starts over and nothing created before that moment counts as new.
MAX_VANISHED = 50_000


@dataclass(frozen=True)
class Registered:
    compass_id: str
    tenant: str
    outcome: str  # adopted | found | registered
    labels: dict[str, str] | None = None  # the Director labels sent, when registered now
    # The mapping as last read or written: its status is written next, and a fresh
    # resourceVersion spares the read the watch has not caught up with yet.
    mapping: Mapping | None = field(default=None, repr=False, compare=False)


Hook = Callable[[KymaView, str], None]


class RegistrationService:
    def __init__(
        self,
        *,
        settings: RegistrationSettings,
        repo: MappingRepository,
        cache: MappingReader,
        director: DirectorApi,
        metrics: Metrics,
        me: str,
        clock: Callable[[], float],
        watch: MappingWatch | None = None,
        after_register: Hook | None = None,
    ) -> None:
        """`watch`: the mapping informer (usually the same object as `cache`). Without it no
        runtime counts as certainly new: every registration is looked up first."""
        self._settings = settings
        self._repo = repo
        self._cache = cache
        self._director = director
        self._metrics = metrics
        self._me = me
        self._clock = clock
        self._flights: SingleFlight[Registered] = SingleFlight()
        # Mappings this process created whose runtime cannot be registered yet: no call of ours
        # can have reached Director for them (only the claim holder registers, and every failed
        # attempt so far failed before its request left). These register without a look-up.
        self._unregistered: set[str] = set()
        # Tests use this to stop the process between Director and KCP (crash tests).
        self._after_register = after_register
        self._watch = watch
        self._vanished: set[str] = set()
        self._vanished_since = 0.0
        if watch is not None:
            watch.add_listener(self._observe)

    def _observe(self, name: str) -> None:
        if self._cache.get(name) is not None:
            return
        # Whatever we knew of the mapping that went is void: someone may have claimed and
        # registered under another mapping of that name since.
        self._unregistered.discard(name)
        if len(self._vanished) >= MAX_VANISHED:
            self._vanished.clear()
            self._vanished_since = self._clock()
        self._vanished.add(name)

    def _certainly_new(self, kyma: KymaView) -> bool:
        listed_at = self._watch.listed_at if self._watch is not None else None
        return state.certainly_new(
            created_at=kyma.created_at,
            watched_since=None if listed_at is None else max(listed_at, self._vanished_since),
            vanished=kyma.name in self._vanished,
        )

    def refused(self, kyma: KymaView) -> CompassTenantUnknown | None:
        """Director's remembered refusal of this Kyma's tenants, while it stands (watch-fed
        view, no request): the caller is told without asking Director again."""
        mapping = self._cache.get(kyma.name)
        refusal = mapping.tenant_refusal if mapping is not None else None
        if refusal is None or not state.refusal_stands(
            refusal, kyma, now=self._clock(), recheck_seconds=self._settings.tenant_recheck_seconds
        ):
            return None
        return tenant_unknown(refusal.label, refusal.value, kyma)

    async def is_gone(
        self, registered: Registered, *, reservation: Reservation | None = None
    ) -> bool:
        """Does Director no longer have the recorded runtime? Asked after Director refused a
        call about it: the refusal may be its answer for a runtime unregistered behind our back
        (a one-time token then fails with code 27, a label with code 10). `reservation`: the
        request's that asks (`DirectorLimiter.call`)."""
        runtime = await self._director.runtime(
            tenant=registered.tenant, runtime_id=registered.compass_id, reservation=reservation
        )
        return runtime is None

    async def forget(self, name: str, compass_id: str) -> tuple[Mapping | None, bool]:
        """Removes `compass_id` from the mapping, only while the mapping still records it;
        returns the mapping as it is now and whether this call removed it: of several replicas
        that noticed, one removes it; the others find it removed or its successor recorded."""
        for _ in range(MAX_ROUNDS):
            try:
                current = await self._repo.get(name)
                if current is None or current.compass_id != compass_id:
                    return current, False
                forgotten = await self._repo.replace(state.forgotten(current))
            except Conflict:
                continue
            except KubeError as exc:
                raise ControlPlaneUnavailable(
                    "cannot read or write the mapping", retry_after=5
                ) from exc
            log.warning(
                "Compass runtime gone from Director; it is registered again on demand",
                extra={"kyma": name, "compass_id": compass_id},
            )
            self._metrics.runtimes_lost.inc()
            return forgotten, True
        raise RegistrationBusy(
            "the mapping kept changing while forgetting a lost runtime", retry_after=1
        )

    def known(self, kyma: KymaView) -> Registered | None:
        """Registered already, by the watch-fed view: the token path needs nothing else."""
        mapping = self._cache.get(kyma.name)
        if mapping is None or mapping.deleting or not mapping.compass_id:
            return None
        return Registered(
            mapping.compass_id, mapping.tenant or kyma.tenant or "", "adopted", mapping=mapping
        )

    async def ensure_registered(
        self,
        kyma: KymaView,
        *,
        fresh: Mapping | None = None,
        reservation: Reservation | None = None,
    ) -> Registered:
        """`fresh`: the mapping as just read or written (the watch-fed view may still show what
        it replaced). `reservation`: the request's whose Director calls these are (None: the
        reconciler's); callers that share a registration share the first one's calls."""
        tenant = kyma.tenant
        if not tenant:
            raise KymaIncomplete("the Kyma has no global account label")
        cached = fresh or self._cache.get(kyma.name)
        if cached is not None and cached.deleting:
            raise KymaDeleting("the runtime's mapping is being deleted")
        if cached is not None and cached.compass_id:
            return Registered(cached.compass_id, cached.tenant or tenant, "adopted", mapping=cached)
        # Concurrent requests of one runtime (and the reconciler) share one registration.
        return await self._flights.do(
            kyma.name, lambda: self._guarded(kyma, tenant, cached, reservation)
        )

    async def _guarded(
        self,
        kyma: KymaView,
        tenant: str,
        cached: Mapping | None,
        reservation: Reservation | None,
    ) -> Registered:
        try:
            return await self._ensure(kyma, tenant, cached, reservation)
        except Conflict as exc:
            raise RegistrationBusy("mapping changed concurrently", retry_after=1) from exc
        except KubeError as exc:
            raise ControlPlaneUnavailable(
                "cannot read or write the mapping", retry_after=5
            ) from exc

    async def _ensure(
        self,
        kyma: KymaView,
        tenant: str,
        mapping: Mapping | None,
        reservation: Reservation | None,
    ) -> Registered:
        s = self._settings
        wait_until = self._clock() + WAIT_FOR_OTHER_SECONDS
        for _ in range(MAX_ROUNDS):
            now = self._clock()
            match state.decide(mapping, me=self._me, now=now):
                case state.Adopt(compass_id=compass_id):
                    return Registered(
                        compass_id,
                        (mapping and mapping.tenant) or tenant,
                        "adopted",
                        mapping=mapping,
                    )
                case state.Refuse(reason=reason):
                    raise KymaDeleting(reason)
                case state.Wait(retry_after=retry_after):
                    # Someone else holds the claim: whatever we knew of this mapping is void.
                    self._unregistered.discard(kyma.name)
                    # Another replica usually records within a second: wait a little for it
                    # rather than sending the agent away.
                    if now >= wait_until:
                        raise RegistrationBusy(
                            "another replica is registering", retry_after=min(retry_after, 5.0)
                        )
                    await asyncio.sleep(0.2)
                    mapping = await self._repo.get(kyma.name)
                case state.CreateClaimed():
                    mapping = await self._create_claimed(kyma, now)
                case state.TakeClaim():
                    assert mapping is not None
                    # A claim that lapsed may have been taken and used by another replica
                    # meanwhile: from here on this runtime is looked up before registering,
                    # unless the lapsed claim is still our own (whoever takes a claim writes
                    # its name into it, so nobody else has held it since).
                    if mapping.claim_holder != self._me:
                        self._unregistered.discard(kyma.name)
                    try:
                        mapping = await self._repo.replace(self._claim(mapping, now))
                    except Conflict:  # lost the race, or our view was stale: decide again
                        mapping = await self._repo.get(kyma.name)
                case state.Proceed(claim_expires=claim_expires):
                    assert mapping is not None
                    budget = 3 * s.director_timeout_seconds + s.director_queue_timeout_seconds
                    if not state.safe_to_register(
                        claim_expires=claim_expires, now=now, call_budget=budget
                    ):
                        mapping = await self._repo.replace(self._claim(mapping, now))
                        continue
                    compass_id, outcome, labels = await self._find_or_register(
                        kyma,
                        tenant,
                        lookup=kyma.name not in self._unregistered,
                        reservation=reservation,
                    )
                    recorded = await self._record(mapping, compass_id, labels)
                    self._unregistered.discard(kyma.name)
                    self._metrics.registrations.labels(outcome).inc()
                    return Registered(compass_id, tenant, outcome, labels, mapping=recorded)
        raise RegistrationBusy("registration did not settle", retry_after=1)

    async def _create_claimed(self, kyma: KymaView, now: float) -> Mapping | None:
        s = self._settings
        try:
            mapping = await self._repo.create(
                state.new_mapping(
                    kyma,
                    namespace=s.kcp_namespace,
                    me=self._me,
                    now=now,
                    claim_seconds=s.registration_claim_seconds,
                )
            )
        except Conflict:  # someone else created it: decide again on what is there
            return await self._repo.get(kyma.name)
        if self._certainly_new(kyma):
            self._unregistered.add(kyma.name)
        return mapping

    def _claim(self, mapping: Mapping, now: float) -> dict[str, object]:
        return state.claimed(
            mapping, me=self._me, now=now, claim_seconds=self._settings.registration_claim_seconds
        )

    async def find(
        self, kyma: KymaView, tenant: str, *, reservation: Reservation | None = None
    ) -> DirectorRuntime | None:
        """The Director runtime registered for this Kyma, if any: by our label, then by
        compass-manager's `gardenerClusterName`; of several, the smallest ID."""
        s = self._settings
        shoot = kyma.labels.get(LABEL_SHOOT)
        try:
            ours = await self._director.runtimes_by_label(
                tenant=tenant,
                key=s.runtime_id_label,
                value=kyma.runtime_id,
                reservation=reservation,
            )
            legacy = []
            if not ours and shoot:
                legacy = await self._director.runtimes_by_label(
                    tenant=tenant,
                    key="gardenerClusterName",
                    value=shoot,
                    reservation=reservation,
                )
        except DirectorTenantUnknown as exc:
            raise tenant_unknown(LABEL_GLOBAL_ACCOUNT, tenant, kyma) from exc
        match state.after_lookup([r.id for r in ours], [r.id for r in legacy]):
            case state.Record(compass_id=compass_id, duplicates=duplicates):
                if duplicates:
                    log.warning(
                        "several Director runtimes for one Kyma; using the first",
                        extra={"kyma": kyma.name, "compass_ids": list(duplicates)},
                    )
                return next(r for r in (*ours, *legacy) if r.id == compass_id)
        return None

    def vanished(self, name: str) -> bool:
        """Was a mapping of this name seen to go (deleted or force-deleted)?"""
        return name in self._vanished

    async def _find_or_register(
        self, kyma: KymaView, tenant: str, *, lookup: bool, reservation: Reservation | None
    ) -> tuple[str, str, dict[str, str] | None]:
        """The Compass runtime ID, how it was obtained, and the labels sent if registered."""
        s = self._settings
        shoot = kyma.labels.get(LABEL_SHOOT)
        labels = naming.director_labels(
            kyma, managed_by=s.managed_by_label_value, runtime_id_label=s.runtime_id_label
        )
        if lookup:
            found = await self.find(kyma, tenant, reservation=reservation)
            if found is not None:
                return found.id, "found", labels_held(found, wanted=labels)
            # Nothing registered, and only the claim holder (us) registers: until a call of
            # ours may have written, the next attempt need not look again.
            self._unregistered.add(kyma.name)
        spec = RuntimeRegisterInput(
            name=naming.derive_name(shoot_name=shoot, runtime_id=kyma.runtime_id),
            description=f"Kyma runtime {kyma.runtime_id}",
            labels=labels,
        )
        try:
            runtime = await self._director.register_runtime(
                tenant=tenant, spec=spec, reservation=reservation
            )
        except DirectorPermanent as exc:
            refusal = refusal_of_tenants(exc, kyma, tenant)
            if refusal is None:
                raise
            raise refusal from exc
        except BaseException as exc:
            if may_have_written(exc):
                self._unregistered.discard(kyma.name)  # the next attempt must look it up
            raise
        log.info(
            "registered runtime in Director", extra={"kyma": kyma.name, "compass_id": runtime.id}
        )
        if self._after_register is not None:
            self._after_register(kyma, runtime.id)
        return runtime.id, "registered", labels

    async def _record(
        self, mapping: Mapping, compass_id: str, labels: dict[str, str] | None
    ) -> Mapping:
        current: Mapping | None = mapping
        for _ in range(MAX_ROUNDS):
            if current is None:
                raise RegistrationBusy("mapping vanished while registering", retry_after=1)
            if current.compass_id:
                if current.compass_id != compass_id:
                    log.warning(
                        "mapping already records another Compass runtime",
                        extra={"kyma": current.name, "compass_id": current.compass_id},
                    )
                return current
            with contextlib.suppress(Conflict):
                return await self._repo.replace(
                    state.recorded(current, compass_id=compass_id, director_labels=labels)
                )
            current = await self._repo.get(mapping.name)
        raise RegistrationBusy("could not record the registration", retry_after=1)


def labels_held(runtime: DirectorRuntime, *, wanted: dict[str, str]) -> dict[str, str]:
    """The labels of ours that a runtime found in Director already holds, as we would write them:
    recorded as synced, so the reconciler writes only what differs (when Director's answer to
    `registerRuntime` was lost, the runtime found has every label, and writing each back cost a
    call apiece)."""
    held = runtime.labels or {}
    return {key: value for key, value in held.items() if key in wanted and isinstance(value, str)}


def tenant_unknown(label: str, value: str, kyma: KymaView) -> CompassTenantUnknown:
    what = "subaccount" if label == LABEL_SUBACCOUNT else "global account"
    return CompassTenantUnknown(
        f"Compass does not know the {what} {value!r} named by the Kyma's label {label}",
        label=label,
        value=value,
    )


def refusal_of_tenants(
    exc: DirectorPermanent, kyma: KymaView, tenant: str
) -> CompassTenantUnknown | None:
    """`registerRuntime`'s refusals that name the Kyma's tenants: an unknown global account
    (code 25), an unknown subaccount (code 20 `object=tenant`), or a subaccount that is not one
    of the global account's (code 27, the only InvalidOperation `registerRuntime` answers)."""
    subaccount = kyma.labels.get(LABEL_SUBACCOUNT) or ""
    if isinstance(exc, DirectorTenantUnknown):
        if exc.subaccount:
            return tenant_unknown(LABEL_SUBACCOUNT, subaccount, kyma)
        return tenant_unknown(LABEL_GLOBAL_ACCOUNT, tenant, kyma)
    if exc.code == INVALID_OPERATION and subaccount:
        return CompassTenantUnknown(
            f"Compass does not know the subaccount {subaccount!r} (Kyma label "
            f"{LABEL_SUBACCOUNT}) as one of global account {tenant!r}",
            label=LABEL_SUBACCOUNT,
            value=subaccount,
        )
    return None
