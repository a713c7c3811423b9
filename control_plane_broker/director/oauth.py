"""OAuth2 client credentials for Director: one access token per process, refreshed before expiry.

Holds: concurrent callers share one fetch, and its failure too (callers that waited for a fetch
that failed do not each try again: in an outage that would be one call per waiter), and so do
callers that arrive within `FAILURE_MEMORY_SECONDS` after it (a call that passed the circuit
breaker just before that failure opened it must not call the token endpoint once more: measured,
a second call 35 ms after the first of an outage); the secret and the access token never reach
a log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from control_plane_broker.capped import KIB, BodyTooLarge, read_capped
from control_plane_broker.director.classification import DirectorPermanent, DirectorRetryable
from control_plane_broker.settings import DirectorCredentials
from kubeapi import describe_transport_error


def refresh_at(*, fetched_at: float, expires_in: float) -> float:
    """Refresh a fifth of the lifetime early (at most 60 s) so no call carries a dying token."""
    margin = min(60.0, max(0.0, expires_in) / 5)
    return fetched_at + max(0.0, expires_in - margin)


# An access token answer is a few KiB (a JWT and its lifetime); beyond this it is not read.
MAX_ANSWER_BYTES = 64 * KIB
FAILURE_MEMORY_SECONDS = 0.5  # below any sensible time open of the breaker: probes go out


class OAuthTokenSource:
    def __init__(
        self,
        http: httpx.AsyncClient,
        credentials: DirectorCredentials,
        *,
        scope: str,
        clock: Callable[[], float],
    ) -> None:
        self._http = http
        self._credentials = credentials
        self._scope = scope
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()
        self._failed: DirectorRetryable | DirectorPermanent | None = None  # the last fetch's
        self._failed_at = 0.0
        self._fetched = 0  # fetches finished, so a waiter knows whether one ended while it waited

    def invalidate(self) -> None:
        self._token = None

    async def token(self) -> str:
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        arrived_after = self._fetched
        async with self._lock:
            if self._token is not None and self._clock() < self._refresh_at:
                return self._token
            if self._failed is not None and (
                self._fetched > arrived_after
                or self._clock() - self._failed_at < FAILURE_MEMORY_SECONDS
            ):
                raise type(self._failed)(str(self._failed))
            try:
                self._token, self._refresh_at = await self._fetch()
                self._failed = None
            except (DirectorRetryable, DirectorPermanent) as exc:
                self._failed, self._failed_at = exc, self._clock()
                raise
            finally:
                self._fetched += 1
            return self._token

    async def _fetch(self) -> tuple[str, float]:
        started = self._clock()
        try:
            async with self._http.stream(
                "POST",
                self._credentials.tokens_endpoint,
                data={"grant_type": "client_credentials", "scope": self._scope},
                auth=(self._credentials.client_id, self._credentials.client_secret),
            ) as response:
                status = response.status_code
                raw = await read_capped(response, MAX_ANSWER_BYTES, what="OAuth token endpoint")
        except httpx.HTTPError as exc:
            raise DirectorRetryable(
                f"OAuth token endpoint: {describe_transport_error(exc)}"
            ) from exc
        except BodyTooLarge as exc:
            raise DirectorRetryable(str(exc)) from None
        if status == 429 or status >= 500:
            raise DirectorRetryable(f"OAuth token endpoint: HTTP {status}")
        if status != 200:
            raise DirectorPermanent(f"OAuth token endpoint refused: HTTP {status}")
        try:
            body = json.loads(raw)
            token = str(body["access_token"])
            expires_in = float(body.get("expires_in", 300))
        except (ValueError, KeyError, TypeError) as exc:
            raise DirectorPermanent("OAuth token endpoint: malformed answer") from exc
        return token, refresh_at(fetched_at=started, expires_in=expires_in)
