"""Carries out the registration decisions of `registration.state` against KCP and Director.

Order that makes it exactly-once (see `state` for the invariants):
claim the mapping → look up by our label (then compass-manager's) → register only when nothing
is found → record the Compass runtime ID on the mapping (and release the claim) before anything
else uses it. After a crash or a lost answer the next attempt finds the runtime by label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from control_plane_broker.director.client import DirectorClient
from control_plane_broker.director.models import RuntimeRegisterInput
from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    KymaDeleting,
    KymaIncomplete,
    RegistrationBusy,
)
from control_plane_broker.kube.client import Conflict, KubeError
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.metrics import Metrics
from control_plane_broker.model import KymaView
from control_plane_broker.registration import naming, state
from control_plane_broker.settings import Settings

log = logging.getLogger(__name__)

MAX_ROUNDS = 6
WAIT_FOR_OTHER_SECONDS = 3.0


@dataclass(frozen=True)
class Registered:
    compass_id: str
    tenant: str
    outcome: str  # adopted | found | registered


class RegistrationService:
    def __init__(
        self,
        *,
        settings: Settings,
        repo: MappingRepository,
        director: DirectorClient,
        metrics: Metrics,
        me: str,
        clock: Callable[[], float],
        crash: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        self._repo = repo
        self._director = director
        self._metrics = metrics
        self._me = me
        self._clock = clock
        self._crash = crash or (lambda: os._exit(70))

    async def ensure_registered(self, kyma: KymaView) -> Registered:
        tenant = kyma.tenant
        if not tenant:
            raise KymaIncomplete("the Kyma has no global account label")
        try:
            return await self._ensure(kyma, tenant)
        except Conflict as exc:
            raise RegistrationBusy("mapping changed concurrently", retry_after=1) from exc
        except KubeError as exc:
            raise ControlPlaneUnavailable(
                "cannot read or write the mapping", retry_after=5
            ) from exc

    async def _ensure(self, kyma: KymaView, tenant: str) -> Registered:
        s = self._settings
        wait_until = self._clock() + WAIT_FOR_OTHER_SECONDS
        rounds = 0
        while rounds < MAX_ROUNDS:
            rounds += 1
            mapping = await self._repo.get(kyma.name)
            now = self._clock()
            decision = state.decide(mapping, me=self._me, now=now)
            match decision:
                case state.Adopt(compass_id=compass_id):
                    return Registered(compass_id, (mapping and mapping.tenant) or tenant, "adopted")
                case state.Refuse(reason=reason):
                    raise KymaDeleting(reason)
                case state.Wait(retry_after=retry_after):
                    # Another replica usually records within a second: wait a little for it
                    # rather than sending the agent away.
                    if self._clock() < wait_until:
                        rounds -= 1
                        await asyncio.sleep(0.2)
                        continue
                    raise RegistrationBusy(
                        "another replica is registering", retry_after=min(retry_after, 5.0)
                    )
                case state.CreateClaimed():
                    # A Conflict means someone else created it: decide again on what is there.
                    with contextlib.suppress(Conflict):
                        await self._repo.create(
                            state.new_mapping(
                                kyma,
                                namespace=s.kcp_namespace,
                                me=self._me,
                                now=now,
                                claim_seconds=s.registration_claim_seconds,
                            )
                        )
                case state.TakeClaim():
                    assert mapping is not None
                    with contextlib.suppress(Conflict):  # lost the race: decide again
                        await self._repo.replace(
                            state.claimed(
                                mapping,
                                me=self._me,
                                now=now,
                                claim_seconds=s.registration_claim_seconds,
                            )
                        )
                case state.Proceed(claim_expires=claim_expires):
                    compass_id, outcome, labels = await self._find_or_register(
                        kyma, tenant, claim_expires
                    )
                    await self._record(kyma.name, compass_id)
                    if labels is not None:
                        # What Director holds now, so the reconciler's label sync has
                        # nothing to write for a runtime it has just seen registered.
                        await self._repo.patch_status(kyma.name, {"directorLabels": labels})
                    self._metrics.registrations.labels(outcome).inc()
                    return Registered(compass_id, tenant, outcome)
        raise RegistrationBusy("registration did not settle", retry_after=1)

    async def _find_or_register(
        self, kyma: KymaView, tenant: str, claim_expires: float
    ) -> tuple[str, str, dict[str, str] | None]:
        """The Compass runtime ID, how it was obtained, and the labels sent if registered."""
        s = self._settings
        ours = await self._director.runtimes_by_label(
            tenant=tenant, key=s.runtime_id_label, value=kyma.runtime_id
        )
        legacy = []
        shoot = kyma.labels.get("kyma-project.io/shoot-name")
        if not ours and shoot:
            legacy = await self._director.runtimes_by_label(
                tenant=tenant, key="gardenerClusterName", value=shoot
            )
        match state.after_lookup([r.id for r in ours], [r.id for r in legacy]):
            case state.Record(compass_id=compass_id, duplicates=duplicates):
                if duplicates:
                    log.warning(
                        "several Director runtimes for one Kyma; using the first",
                        extra={"kyma": kyma.name, "compass_ids": list(duplicates)},
                    )
                return compass_id, "found", None
            case state.Register():
                pass
        budget = 3 * s.director_timeout_seconds + s.director_queue_timeout_seconds
        if not state.safe_to_register(
            claim_expires=claim_expires, now=self._clock(), call_budget=budget
        ):
            raise RegistrationBusy("claim too close to expiry", retry_after=1)
        labels = naming.director_labels(
            kyma, managed_by=s.managed_by_label_value, runtime_id_label=s.runtime_id_label
        )
        spec = RuntimeRegisterInput(
            name=naming.derive_name(shoot_name=shoot, runtime_id=kyma.runtime_id),
            description=f"Kyma runtime {kyma.runtime_id}",
            labels=labels,
        )
        runtime = await self._director.register_runtime(tenant=tenant, spec=spec)
        log.info(
            "registered runtime in Director", extra={"kyma": kyma.name, "compass_id": runtime.id}
        )
        if s.test_crash_point == "after-register":
            self._crash()
        return runtime.id, "registered", labels

    async def _record(self, name: str, compass_id: str) -> None:
        for _ in range(MAX_ROUNDS):
            mapping = await self._repo.get(name)
            if mapping is None:
                raise RegistrationBusy("mapping vanished while registering", retry_after=1)
            if mapping.compass_id:
                if mapping.compass_id != compass_id:
                    log.warning(
                        "mapping already records another Compass runtime",
                        extra={"kyma": name, "compass_id": mapping.compass_id},
                    )
                return
            try:
                await self._repo.replace(state.recorded(mapping, compass_id=compass_id))
            except Conflict:
                continue
            return
        raise RegistrationBusy("could not record the registration", retry_after=1)
