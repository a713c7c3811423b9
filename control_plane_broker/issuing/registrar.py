"""The token path's registration: which Compass runtime a token is requested for.

Over `registration.service` (exactly-once registration, shared with the reconciler), it owns
what the token path decides about a registration:

- refused: Director's remembered refusal of the Kyma's tenants, while it stands, answers before
  any capacity is reserved (`known`);
- known: a runtime the watch-fed mapping shows registered needs its token only (`known`);
- registered now, on the request's reservation, its failure written on the mapping's
  `Registered` condition (`register`);
- lost: a known runtime whose token Director refused because Director no longer has it
  (unregistered behind our back) is forgotten on the mapping and registered again, once; of
  several replicas (or requests) that notice at once, one forgets and registers, the others
  adopt what it records (`registered_again`).
"""

from __future__ import annotations

from control_plane_broker.director.classification import DirectorPermanent, DirectorTenantUnknown
from control_plane_broker.errors import CompassRejected, CompassTenantUnknown, CompassUnavailable
from control_plane_broker.issuing.status_later import StatusLater
from control_plane_broker.kyma import LABEL_SUBACCOUNT, KymaView
from control_plane_broker.overload.reservations import Reservation
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration import state
from control_plane_broker.registration.service import Registered, RegistrationService


class Registrar:
    def __init__(
        self, *, registration: RegistrationService, status: StatusRecorder, later: StatusLater
    ) -> None:
        self._registration = registration
        self._status = status
        self._later = later

    def known(self, kyma: KymaView) -> Registered | None:
        """The runtime registered for `kyma` already (watch-fed view, no request), or None when
        it is to be registered; raises Director's remembered refusal of the Kyma's tenants."""
        refused = self._registration.refused(kyma)
        if refused is not None:
            raise refused
        return self._registration.known(kyma)

    async def register(
        self, kyma: KymaView, *, reservation: Reservation, fresh: state.Mapping | None = None
    ) -> Registered:
        """`fresh`: the mapping as just read or written."""
        try:
            return await self._registration.ensure_registered(
                kyma, fresh=fresh, reservation=reservation
            )
        except (CompassUnavailable, CompassRejected) as exc:
            await self._later.failed(kyma, "Registered", "RegistrationFailed", exc)
            raise
        except CompassTenantUnknown as exc:
            # Remembered on the mapping at once: the next request is refused without Director.
            await self._status.failed(
                kyma=kyma,
                condition="Registered",
                event_reason="CompassTenantUnknown",
                exc=exc,
                refusal=state.TenantRefusal(
                    global_account=kyma.tenant or "",
                    subaccount=kyma.labels.get(LABEL_SUBACCOUNT) or None,
                    label=exc.label,
                    value=exc.value,
                    at=self._status.now(),
                ),
            )
            raise

    async def registered_again(
        self,
        kyma: KymaView,
        known: Registered,
        refusal: DirectorPermanent,
        *,
        reservation: Reservation,
    ) -> Registered:
        """Director refused a call about the `known` runtime with `refusal`: the runtime
        registered again when Director no longer has it; otherwise `refusal` is raised (a
        refusal of the tenant, or of a runtime Director still has, is the answer)."""
        if isinstance(refusal, DirectorTenantUnknown):
            raise refusal
        if not await self._registration.is_gone(known, reservation=reservation):
            raise refusal
        fresh, forgotten = await self._registration.forget(kyma.name, known.compass_id)
        if forgotten:
            await self._status.runtime_lost(kyma=kyma, compass_id=known.compass_id)
        return await self.register(kyma, reservation=reservation, fresh=fresh)
