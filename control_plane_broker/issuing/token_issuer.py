"""The token request use case: guard → reserve → register → token.

- guard, cheapest refusals first: the runtime proven (`identity.runtime_proof`: the runtime
  ID, the Kyma cache synced, the caller still waiting, the identity, not revoked, the policy on
  the cached Kyma) → per-runtime rate limit;
- reserve: Director's remembered refusal of the Kyma's tenants (`Registrar.known`) → circuit
  breaker → a reservation of Director's capacity (`DirectorLimiter.reserve`), passed to every
  Director call of the request;
- register: only a runtime not registered yet (`Registrar.register`);
- token: request it (a runtime Director shows gone is forgotten and registered again, once:
  `Registrar.registered_again`) → answer → record the token in the mapping's status.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from control_plane_broker.director.answers import OneTimeToken
from control_plane_broker.director.classification import DirectorPermanent
from control_plane_broker.director.graphql_client import DirectorApi
from control_plane_broker.errors import CompassRejected, CompassUnavailable, RateLimited
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.identity.verifier import IdentityChecked
from control_plane_broker.issuing.registrar import Registrar
from control_plane_broker.issuing.status_later import AfterAnswer, StatusLater
from control_plane_broker.kyma import KymaView
from control_plane_broker.overload.director_limiter import CallerPresent, DirectorLimiter
from control_plane_broker.overload.rate_limit import RateLimiter
from control_plane_broker.overload.reservations import Reservation
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration.service import Registered, RegistrationService

# The name it logged under before it moved into its package: log lines stay as they were.
log = logging.getLogger("control_plane_broker.issuing")


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
        request_deadline_seconds: float,
        proof: RuntimeProof,
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
        awaited before the answer). `request_deadline_seconds`: how long after its arrival a
        request may still be answered (`BROKER_REQUEST_DEADLINE_SECONDS`)."""
        self._deadline_seconds = request_deadline_seconds
        self._proof = proof
        self._director = director
        self._director_limiter = director_limiter
        self._status = status
        self._limiter = limiter
        self._clock = clock  # monotonic: rate limits
        self._later = StatusLater(status, after_answer=after_answer)
        self._registrar = Registrar(registration=registration, status=status, later=self._later)

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
        deadline = (self._clock() if arrived_at is None else arrived_at) + self._deadline_seconds
        kyma = await self._guard(runtime_id, headers, caller_present, identity_checked)
        known = self._registrar.known(kyma)
        reservation = self._director_limiter.reserve(
            kyma.name, calls=1 if known else 2, deadline=deadline
        )
        try:
            registered = known or await self._registrar.register(kyma, reservation=reservation)
            registered, ott = await self._token(
                kyma, registered, reservation, known=known is not None, caller=caller_present
            )
            return await self._issued(kyma, registered, ott)
        finally:
            self._director_limiter.finish(reservation)

    async def _guard(
        self,
        runtime_id: str,
        headers: Mapping[str, str],
        caller_present: CallerPresent | None,
        identity_checked: IdentityChecked | None,
    ) -> KymaView:
        """The Kyma a token may be issued for, or the refusal, cheapest first and nothing of
        Director's spent: the runtime proven (`RuntimeProof`), then the per-runtime rate."""
        kyma = await self._proof.proven_kyma(
            runtime_id,
            headers,
            endpoint="token",
            caller_present=caller_present,
            identity_checked=identity_checked,
        )
        wait = self._limiter.check(kyma.name, self._clock())
        if wait is not None:
            raise RateLimited("token issue rate exceeded for this runtime", retry_after=wait)
        return kyma

    async def _token(
        self,
        kyma: KymaView,
        registered: Registered,
        reservation: Reservation,
        *,
        known: bool,
        caller: CallerPresent | None,
    ) -> tuple[Registered, OneTimeToken]:
        """The one-time token for `registered`, and the runtime it is for: a `known` runtime
        Director shows gone is registered again, once (`Registrar.registered_again`). Director
        failing is written on the mapping's `TokenIssued` condition after the answer."""
        try:
            try:
                ott = await self._one_time_token(
                    registered, reservation, follow_up=not known, caller=caller
                )
            except DirectorPermanent as exc:
                if not known:
                    raise
                registered = await self._registrar.registered_again(
                    kyma, registered, exc, reservation=reservation
                )
                ott = await self._one_time_token(
                    registered, reservation, follow_up=True, caller=caller
                )
        except (CompassUnavailable, CompassRejected) as exc:
            await self._later.failed(
                kyma, "TokenIssued", "TokenRequestFailed", exc, director_labels=registered.labels
            )
            raise
        return registered, ott

    async def _one_time_token(
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

    async def _issued(
        self, kyma: KymaView, registered: Registered, ott: OneTimeToken
    ) -> IssuedToken:
        # Only issued tokens count: attempts that fail (Compass down) must not lock a runtime out.
        self._limiter.try_take(kyma.name, self._clock())
        log.info("token issued", extra={"kyma": kyma.name, "compass_id": registered.compass_id})
        await self._later.run(functools.partial(self._record_issued, kyma, registered), kyma=kyma)
        return IssuedToken(
            token=ott.token,
            connector_url=ott.connector_url,
            compass_runtime_id=registered.compass_id,
            tenant=registered.tenant,
            expires_at=ott.expires_at,
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
