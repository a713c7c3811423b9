"""The token request use case: validate → find the Kyma → prove identity → policy → issue.

Holds: nothing reaches Director unless the runtime ID is valid, the Kyma is in the cache, the
caller proved to be this runtime and policy allows it; per runtime, concurrent requests share one
registration and one token request (single-flight), and issued tokens are rate-limited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from control_plane_broker.director.client import DirectorClient
from control_plane_broker.errors import (
    CompassRejected,
    CompassUnavailable,
    NotReady,
    RateLimited,
    RuntimeNotFound,
)
from control_plane_broker.identity.verifier import Verifier
from control_plane_broker.kube.client import KubeError
from control_plane_broker.kube.events import EventRecorder
from control_plane_broker.kube.kyma_cache import KymaCache
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.model import KymaView
from control_plane_broker.policy import check_token_allowed, validate_runtime_id
from control_plane_broker.ratelimit import RateLimiter
from control_plane_broker.registration import state
from control_plane_broker.registration.service import RegistrationService
from control_plane_broker.settings import Settings
from control_plane_broker.singleflight import SingleFlight
from control_plane_broker.status import StatusRecorder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IssuedToken:
    token: str
    connector_url: str
    compass_runtime_id: str
    tenant: str
    expires_at: Any

    def __repr__(self) -> str:
        return f"IssuedToken(compass_runtime_id={self.compass_runtime_id!r}, token=...)"


class TokenIssuer:
    def __init__(
        self,
        *,
        settings: Settings,
        cache: KymaCache,
        verifier: Verifier,
        registration: RegistrationService,
        director: DirectorClient,
        repo: MappingRepository,
        events: EventRecorder,
        limiter: RateLimiter,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._verifier = verifier
        self._registration = registration
        self._director = director
        self._repo = repo
        self._events = events
        self._limiter = limiter
        self._clock = clock  # monotonic: rate limits
        self._wall = wall  # wall time: timestamps written on the mapping
        self._flights: SingleFlight[IssuedToken] = SingleFlight()
        self._status = StatusRecorder(repo=repo, events=events, clock=wall)

    async def issue(self, runtime_id: str, headers: Mapping[str, str]) -> IssuedToken:
        kyma_name = validate_runtime_id(runtime_id)
        if not self._cache.synced:
            raise NotReady("the Kyma cache has not synced yet", retry_after=2)
        kyma = self._cache.get(kyma_name)
        if kyma is None:  # nothing to prove an identity against
            raise RuntimeNotFound("no Kyma for this runtime")
        await self._verifier.verify(kyma=kyma, runtime_id=runtime_id, headers=headers)
        kyma = check_token_allowed(
            self._cache.get(kyma_name),
            module=self._settings.module_name,
            module_required=self._settings.module_policy == "required",
        )
        return await self._flights.do(kyma.name, lambda: self._issue(kyma))

    async def _issue(self, kyma: KymaView) -> IssuedToken:
        # Only issued tokens count: attempts that fail (Compass down) must not lock a runtime out.
        wait = self._limiter.check(kyma.name, self._clock())
        if wait is not None:
            raise RateLimited("token issue rate exceeded for this runtime", retry_after=wait)
        try:
            registered = await self._registration.ensure_registered(kyma)
        except (CompassUnavailable, CompassRejected) as exc:
            await self._status.failed(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                condition="Registered",
                event_reason="RegistrationFailed",
                exc=exc,
            )
            raise
        if registered.outcome == "registered":
            await self._events.record(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                reason="RuntimeRegistered",
                message=f"registered in Compass as runtime {registered.compass_id}",
            )
        try:
            ott = await self._director.request_one_time_token(
                tenant=registered.tenant, runtime_id=registered.compass_id
            )
        except (CompassUnavailable, CompassRejected) as exc:
            await self._status.failed(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                condition="TokenIssued",
                event_reason="TokenRequestFailed",
                exc=exc,
            )
            raise
        self._limiter.try_take(kyma.name, self._clock())
        log.info(
            "token issued",
            extra={"kyma": kyma.name, "compass_id": registered.compass_id},
        )
        await self._note_issued(kyma, registered.compass_id)
        return IssuedToken(
            token=ott.token,
            connector_url=ott.connector_url,
            compass_runtime_id=registered.compass_id,
            tenant=registered.tenant,
            expires_at=ott.expires_at,
        )

    async def _note_issued(self, kyma: KymaView, compass_id: str) -> None:
        """Best effort: status and Event; failing to write them must not withhold the token."""
        now = self._wall()
        try:
            mapping = await self._repo.get(kyma.name)
            conditions = list(
                ((mapping.raw if mapping else {}).get("status") or {}).get("conditions") or []
            )
            for type_, reason, message in (
                ("Registered", "RuntimeRegistered", f"Compass runtime {compass_id}"),
                ("TokenIssued", "TokenIssued", "a one-time token was handed to the runtime agent"),
            ):
                conditions = state.set_condition(
                    conditions,
                    type_=type_,
                    status=True,
                    reason=reason,
                    message=message,
                    now=now,
                    observed_generation=state.generation_of(mapping),
                )
            await self._repo.patch_status(
                kyma.name,
                {
                    "registered": True,
                    "configured": True,
                    "state": "Ready",
                    "lastTokenIssuedAt": state.to_rfc3339(now),
                    "conditions": conditions,
                },
            )
        except KubeError as exc:
            log.warning(
                "could not update mapping status", extra={"kyma": kyma.name, "error": str(exc)}
            )
        await self._events.record(
            kyma_name=kyma.name,
            kyma_uid=kyma.uid,
            reason="TokenIssued",
            message="one-time token issued to the runtime agent",
        )
