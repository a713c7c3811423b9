"""The token request use case, cheapest refusals first:

validate the runtime ID → the Kyma cache is synced → the caller still waits → prove the identity →
not revoked → policy on the cached Kyma → per-runtime rate limit → Director's remembered refusal
of the Kyma's tenants → circuit breaker → a reservation of Director's capacity → register (only a
runtime not registered yet) → request the token (a runtime Director shows gone is forgotten and
registered again, once) → answer → record the token in the mapping's status.

Holds: nothing reaches Director unless the runtime ID is valid, the caller proved to be this
runtime, the Kyma allows it and Director's capacity has room for the request within the queue
timeout and before the request's deadline, counted from its arrival (otherwise the caller is
told when to come back); a token is requested only when its answer can reach the caller before
that deadline, and the answer does not wait for the mapping's status; an unknown runtime and a
bad proof look the same to a caller that cannot prove who it is (both 401); concurrent requests
of one runtime share one registration, but every caller gets its own one-time token; a runtime
whose mapping is being deleted gets none; a revoked runtime gets none (told only once it proved
who it is); issued tokens are rate-limited per runtime.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from control_plane_broker.director.answers import OneTimeToken
from control_plane_broker.director.classification import DirectorPermanent, DirectorTenantUnknown
from control_plane_broker.director.graphql_client import DirectorApi
from control_plane_broker.errors import (
    CallerGone,
    CompassRejected,
    CompassTenantUnknown,
    CompassUnavailable,
    NotReady,
    RateLimited,
)
from control_plane_broker.identity.verifier import IdentityChecked, Verifier, prove
from control_plane_broker.kyma import LABEL_SUBACCOUNT, KymaView
from control_plane_broker.mapping_status import StatusRecorder
from control_plane_broker.overload.director_limiter import CallerPresent, DirectorLimiter
from control_plane_broker.overload.rate_limit import RateLimiter
from control_plane_broker.overload.reservations import Reservation
from control_plane_broker.policy import check_token_allowed, validate_runtime_id
from control_plane_broker.registration import state
from control_plane_broker.registration.service import Registered, RegistrationService
from control_plane_broker.revocation.revocation_gate import RevocationGate
from control_plane_broker.settings import Settings

log = logging.getLogger(__name__)


# Takes a write to run later (`DeferredWrites.defer`); False when it could not take it.
AfterAnswer = Callable[[Callable[[], Awaitable[object]]], bool]


class KymaReader(Protocol):
    """What the request path needs of the Kyma cache (watch-fed; no API call per request)."""

    @property
    def synced(self) -> bool: ...

    def get(self, name: str) -> KymaView | None: ...


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
        cache: KymaReader,
        verifier: Verifier,
        gate: RevocationGate,
        registration: RegistrationService,
        director: DirectorApi,
        director_limiter: DirectorLimiter,
        status: StatusRecorder,
        limiter: RateLimiter,
        clock: Callable[[], float],
        after_answer: AfterAnswer | None = None,
    ) -> None:
        """`after_answer`: takes the writes no answer waits for (the mapping's status, once a
        token is issued or Director failed), to run later (`overload/deferred_writes`): a
        status write under load can take seconds, and while requests wait for Director they
        must not share the broker and the KCP API server with bookkeeping (default: they are
        awaited before the answer)."""
        self._settings = settings
        self._cache = cache
        self._verifier = verifier
        self._gate = gate
        self._registration = registration
        self._director = director
        self._director_limiter = director_limiter
        self._status = status
        self._limiter = limiter
        self._clock = clock  # monotonic: rate limits
        self._after_answer = after_answer

    async def issue(
        self,
        runtime_id: str,
        headers: Mapping[str, str],
        *,
        caller_present: CallerPresent | None = None,
        identity_checked: IdentityChecked | None = None,
        arrived_at: float | None = None,
    ) -> IssuedToken:
        """`caller_present` tells whether the caller still waits (the HTTP connection is open).
        A request whose caller is gone before it is served costs nothing more (in a burst the
        loop reaches some only after their agents' timeout; proving their identity would fetch
        keys for nobody); a registration already begun goes on without the caller (the next
        request needs only the token); a token is requested only for a caller still there.
        `identity_checked` is told once the identity check is over, passed or not: the
        first-contact limit in front of the app (`api/first_contact_middleware.py`) lets the next
        first contact in (`identity.verifier.prove`). `arrived_at` (this issuer's clock): when
        the request reached the broker; its deadline, which its reservation carries to each of
        its Director calls, counts from then (default: now)."""
        deadline = (
            self._clock() if arrived_at is None else arrived_at
        ) + self._settings.request_deadline_seconds
        kyma_name = validate_runtime_id(runtime_id)
        if not self._cache.synced:
            raise NotReady("the Kyma cache has not synced yet", retry_after=2)
        if caller_present is not None and not await caller_present():
            raise CallerGone("the caller hung up before its request was served")
        # Identity before existence: who cannot prove to be this runtime learns nothing about it.
        identity = await prove(
            self._verifier, runtime_id=runtime_id, headers=headers, checked=identity_checked
        )
        self._gate.check(kyma_name, identity, endpoint="token")
        kyma = check_token_allowed(
            self._cache.get(kyma_name),
            module=self._settings.module_name,
            module_required=self._settings.module_policy == "required",
        )
        wait = self._limiter.check(kyma.name, self._clock())
        if wait is not None:
            raise RateLimited("token issue rate exceeded for this runtime", retry_after=wait)
        refused = self._registration.refused(kyma)
        if refused is not None:
            raise refused
        known = self._registration.known(kyma)
        reservation = self._director_limiter.reserve(
            kyma.name, calls=1 if known else 2, deadline=deadline
        )
        try:
            return await self._reserved(kyma, known, reservation, caller_present)
        finally:
            self._director_limiter.finish(reservation)

    async def _reserved(
        self,
        kyma: KymaView,
        known: Registered | None,
        reservation: Reservation,
        caller: CallerPresent | None,
    ) -> IssuedToken:
        """The request's Director calls, on its `reservation`: register (unless `known`), then
        the token; a known runtime Director shows gone is registered again, once."""
        registered = known or await self._register(kyma, reservation=reservation)
        try:
            try:
                ott = await self._token(
                    registered, reservation, follow_up=known is None, caller=caller
                )
            except DirectorPermanent as exc:
                if known is None or isinstance(exc, DirectorTenantUnknown):
                    raise
                if not await self._registration.is_gone(known, reservation=reservation):
                    raise
                registered = await self._register_lost(kyma, known, reservation)
                ott = await self._token(registered, reservation, follow_up=True, caller=caller)
        except (CompassUnavailable, CompassRejected) as exc:
            await self._failed_later(
                kyma, "TokenIssued", "TokenRequestFailed", exc, director_labels=registered.labels
            )
            raise
        # Only issued tokens count: attempts that fail (Compass down) must not lock a runtime out.
        self._limiter.try_take(kyma.name, self._clock())
        log.info("token issued", extra={"kyma": kyma.name, "compass_id": registered.compass_id})
        await self._later(functools.partial(self._record_issued, kyma, registered), kyma=kyma)
        return IssuedToken(
            token=ott.token,
            connector_url=ott.connector_url,
            compass_runtime_id=registered.compass_id,
            tenant=registered.tenant,
            expires_at=ott.expires_at,
        )

    async def _later(self, write: Callable[[], Awaitable[object]], *, kyma: KymaView) -> None:
        if self._after_answer is None:
            await write()
            return
        if not self._after_answer(write):
            log.error(
                "mapping status not written: too many writes waiting", extra={"kyma": kyma.name}
            )

    async def _failed_later(
        self,
        kyma: KymaView,
        condition: str,
        event_reason: str,
        exc: BaseException,
        *,
        director_labels: dict[str, str] | None = None,
    ) -> None:
        await self._later(
            functools.partial(
                self._status.failed,
                kyma=kyma,
                condition=condition,
                event_reason=event_reason,
                exc=exc,
                director_labels=director_labels,
            ),
            kyma=kyma,
        )

    async def _record_issued(self, kyma: KymaView, registered: Registered) -> None:
        # Best effort, and after the answer nobody could be told of a failure: logged by type.
        try:
            await self._status.issued(kyma=kyma, registered=registered)
        except Exception as exc:
            log.error(
                "could not record the issued token on the mapping",
                extra={"kyma": kyma.name, "error": type(exc).__name__},
            )

    async def _token(
        self,
        registered: Registered,
        reservation: Reservation,
        *,
        follow_up: bool,
        caller: CallerPresent | None,
    ) -> OneTimeToken:
        return await self._director.request_one_time_token(
            tenant=registered.tenant,
            runtime_id=registered.compass_id,
            reservation=reservation,
            follow_up=follow_up,
            caller_present=caller,
        )

    async def _register_lost(
        self, kyma: KymaView, lost: Registered, reservation: Reservation
    ) -> Registered:
        """Director no longer has the runtime recorded for this Kyma (unregistered behind our
        back): forget it and register the runtime again. Of several replicas (or requests) that
        notice at once, one forgets and registers; the others adopt what it records."""
        fresh, forgotten = await self._registration.forget(kyma.name, lost.compass_id)
        if forgotten:
            await self._status.runtime_lost(kyma=kyma, compass_id=lost.compass_id)
        return await self._register(kyma, reservation=reservation, fresh=fresh)

    async def _register(
        self, kyma: KymaView, *, reservation: Reservation, fresh: state.Mapping | None = None
    ) -> Registered:
        try:
            return await self._registration.ensure_registered(
                kyma, fresh=fresh, reservation=reservation
            )
        except (CompassUnavailable, CompassRejected) as exc:
            await self._failed_later(kyma, "Registered", "RegistrationFailed", exc)
            raise
        except CompassTenantUnknown as exc:
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
