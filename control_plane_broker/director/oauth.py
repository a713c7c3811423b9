"""OAuth2 client credentials for Director: one access token per process, refreshed before expiry,
from credentials kept current while the broker runs.

Holds:

- Concurrent callers share one fetch, and its failure too (callers that waited for a fetch that
  failed do not each try again: in an outage that would be one call per waiter), and so do
  callers that arrive within `FAILURE_MEMORY_SECONDS` after it (a call that passed the circuit
  breaker just before that failure opened it must not call the token endpoint once more:
  measured, a second call 35 ms after the first of an outage).
- Every answer of the token endpoint other than a 200 with a usable token is about Compass or
  the broker's own credentials, never about a runtime: 400, 401 and 403 (the credentials or
  their scope refused) raise `DirectorCredentialsRefused`, anything else (a transport error,
  5xx, 429, another status, a malformed answer) `DirectorRetryable`. Both are 503
  `compass-unavailable` with Retry-After, and the breaker counts them. They are raised before
  any GraphQL call left, so they never hide a registration.
- The credentials file (`CredentialsFile`) is looked at (one `stat`) at most every
  `CHECK_EVERY_SECONDS`, and at once after a refusal; a changed client id, secret or endpoint
  drops the cached access token, and after a refusal the new credentials are tried at once.
  Kubernetes updates a mounted Secret by swapping a symlink (`..data`), so a rotation needs no
  restart.
- A refusal episode (refusals of the same credentials with no token between them) logs one
  ERROR naming the endpoint, the HTTP status and the OAuth `error` code, never the secret nor
  anything else of the answer; the token endpoint accepting again logs one WARNING. Each refusal
  and each token fetched is told to `on_verdict` (the metrics); `refusal()` says what /readyz
  reports.
- The secret and the access token never reach a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from control_plane_broker.capped import KIB, BodyTooLarge, read_capped
from control_plane_broker.director.classification import (
    DirectorCredentialsRefused,
    DirectorRetryable,
)
from control_plane_broker.settings import (
    CredentialsInvalid,
    DirectorCredentials,
    load_director_credentials,
)
from kubeapi import describe_transport_error

log = logging.getLogger(__name__)


def refresh_at(*, fetched_at: float, expires_in: float) -> float:
    """Refresh a fifth of the lifetime early (at most 60 s) so no call carries a dying token."""
    margin = min(60.0, max(0.0, expires_in) / 5)
    return fetched_at + max(0.0, expires_in - margin)


# An access token answer is a few KiB (a JWT and its lifetime); beyond this it is not read.
MAX_ANSWER_BYTES = 64 * KIB
FAILURE_MEMORY_SECONDS = 0.5  # below any sensible time open of the breaker: probes go out
# The kubelet takes up to a minute or so to swap in a changed Secret; a stat every few seconds
# adds little to that and costs nothing.
CHECK_EVERY_SECONDS = 5.0
# 400 is RFC 6749's answer to a refused grant or scope (and to a refused client, besides 401);
# 403 is a gateway's in front of the token endpoint.
REFUSED_STATUSES = frozenset({400, 401, 403})
# RFC 6749 5.2: `error` is ASCII without `"` and `\`; anything else is not logged.
_OAUTH_ERROR = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def endpoint_for_logs(url: str) -> str:
    """The token endpoint as logs name it: scheme, host, port and path, never user info or a
    query."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(not a URL)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


def oauth_error_code(raw: bytes) -> str | None:
    """The OAuth `error` code of an error answer (`invalid_client`), when it is one; nothing else
    of the body (`error_description` is free text)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    code = body.get("error") if isinstance(body, dict) else None
    return code if isinstance(code, str) and _OAUTH_ERROR.fullmatch(code) else None


def parse_token_answer(raw: bytes) -> tuple[str, float] | None:
    """(access token, lifetime in seconds) of a 200 answer, or None when it has no usable token."""
    try:
        body = json.loads(raw)
        token, lifetime = body["access_token"], body.get("expires_in", 300)
        # A lifetime as a JSON number or a numeric string; never a boolean.
        expires_in = float(lifetime) if not isinstance(lifetime, bool) else math.nan
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(token, str) or not token.strip():
        return None
    if not math.isfinite(expires_in) or expires_in <= 0:
        return None
    return token, expires_in


class CredentialsFile:
    """compass-manager's credentials file (`BROKER_DIRECTOR_CREDENTIALS_FILE`), kept current.

    Read at construction (a missing or invalid file raises there: start-up stops). Then looked
    at with one `stat` of the resolved path at most every `check_every` seconds (`current`), or
    at once (`check`); read again only when the resolved path, inode, size or modification time
    changed. A file that became unreadable or invalid keeps the last good credentials in force
    and logs one ERROR per problem (its text names the file and what is wrong, never a value).
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        check_every: float = CHECK_EVERY_SECONDS,
    ) -> None:
        self.path = path
        self._clock = clock
        self._check_every = check_every
        self._signature = self._stat()
        self._credentials = load_director_credentials(path)
        self._checked_at = clock()
        self._problem: str | None = None  # the one logged while the file stays broken

    def _stat(self) -> tuple[str, int, int, int, int]:
        resolved = os.path.realpath(self.path)
        st = os.stat(resolved)
        return resolved, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> DirectorCredentials:
        if self._clock() - self._checked_at >= self._check_every:
            self.check()
        return self._credentials

    def check(self) -> DirectorCredentials:
        self._checked_at = self._clock()
        try:
            signature = self._stat()
        except OSError as exc:
            self._broken(f"{self.path}: cannot be read ({exc.strerror or type(exc).__name__})")
            return self._credentials
        if signature == self._signature:
            return self._credentials
        try:
            fresh = load_director_credentials(self.path)
        except CredentialsInvalid as exc:
            self._signature = signature  # logged once; read again when it changes again
            self._broken(str(exc))
            return self._credentials
        self._signature, self._problem = signature, None
        changed = _changed(self._credentials, fresh)
        if changed:
            log.info(
                "Director credentials file read again: new credentials in force",
                extra={"file": str(self.path), "client_id": fresh.client_id, "changed": changed},
            )
        self._credentials = fresh
        return fresh

    def _broken(self, problem: str) -> None:
        if problem == self._problem:
            return
        self._problem = problem
        log.error(
            "Director credentials file cannot be used; the last good credentials stay in force",
            extra={"problem": problem, "client_id": self._credentials.client_id},
        )


def _changed(old: DirectorCredentials, new: DirectorCredentials) -> list[str]:
    """The parts that changed, by name (never by value)."""
    return [
        name
        for name, differs in (
            ("client_id", old.client_id != new.client_id),
            ("secret", old.client_secret != new.client_secret),
            ("endpoint", old.tokens_endpoint != new.tokens_endpoint),
        )
        if differs
    ]


@dataclass
class _Refusal:
    """One refusal episode: the credentials refused, and how the endpoint said so."""

    credentials: DirectorCredentials
    status: int
    error: str | None
    since: float
    count: int = 1


class OAuthTokenSource:
    def __init__(
        self,
        http: httpx.AsyncClient,
        credentials: DirectorCredentials | CredentialsFile,
        *,
        scope: str,
        clock: Callable[[], float],
        on_verdict: Callable[[bool], None] | None = None,
    ) -> None:
        """`credentials`: fixed, or a file kept current. `on_verdict(accepted)`: told False at
        each refusal of the credentials, True at each token fetched."""
        self._http = http
        self._file = credentials if isinstance(credentials, CredentialsFile) else None
        self._credentials = (
            credentials.current() if isinstance(credentials, CredentialsFile) else credentials
        )
        self._scope = scope
        self._clock = clock
        self._on_verdict = on_verdict
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()
        self._failed: DirectorRetryable | None = None  # the last fetch's
        self._failed_at = 0.0
        self._fetched = 0  # fetches finished, so a waiter knows whether one ended while it waited
        self._refusal: _Refusal | None = None  # the episode under way
        self._last_status: tuple[int, str | None] = (0, None)  # the last refusal's, for its log

    def invalidate(self) -> None:
        self._token = None

    def _in_force(self, *, check: bool = False) -> DirectorCredentials:
        """The credentials in force; a change drops the token and the remembered failure."""
        if self._file is not None:
            fresh = self._file.check() if check else self._file.current()
            if fresh != self._credentials:
                self._credentials = fresh
                self._token, self._failed = None, None
        return self._credentials

    def refusal(self) -> str | None:
        """What /readyz reports while the token endpoint refuses the credentials, else None."""
        r = self._refusal
        if r is None:
            return None
        error = f" {r.error}" if r.error else ""
        return (
            f"Director's OAuth token endpoint {endpoint_for_logs(r.credentials.tokens_endpoint)} "
            f"refuses the broker's credentials (client {r.credentials.client_id}): "
            f"HTTP {r.status}{error}, {r.count} time(s) in {self._clock() - r.since:.0f} s; "
            "token requests get 503 compass-unavailable (docs/operations.md)"
        )

    async def token(self) -> str:
        self._in_force()
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        arrived_after = self._fetched
        async with self._lock:
            if self._token is not None and self._clock() < self._refresh_at:
                return self._token
            failed = self._failed
            if failed is not None and (
                self._fetched > arrived_after
                or self._clock() - self._failed_at < FAILURE_MEMORY_SECONDS
            ):
                # A copy without the cause: only the request whose fetch failed logs what the
                # endpoint answered (`upstream request failed`), not every request sharing it.
                raise type(failed)(str(failed))
            try:
                used, token, refresh = await self._fetch_in_force()
                self._failed = None
            except DirectorRetryable as exc:
                self._failed, self._failed_at = exc, self._clock()
                raise
            finally:
                self._fetched += 1
            if used == self._credentials:  # not replaced by a file change while it was fetched
                self._token, self._refresh_at = token, refresh
            return token

    async def _fetch_in_force(self) -> tuple[DirectorCredentials, str, float]:
        """One fetch with the credentials in force, and which they were; after a refusal, the
        file is looked at and, when it changed, the new credentials are tried at once."""
        credentials = self._in_force()
        try:
            return credentials, *await self._fetch_told(credentials)
        except DirectorCredentialsRefused:
            if self._file is None or self._in_force(check=True) == credentials:
                raise
        credentials = self._credentials
        return credentials, *await self._fetch_told(credentials)

    async def _fetch_told(self, credentials: DirectorCredentials) -> tuple[str, float]:
        try:
            fetched = await self._fetch(credentials)
        except DirectorCredentialsRefused:
            self._refused(credentials)
            raise
        self._accepted(credentials)
        return fetched

    def _refused(self, credentials: DirectorCredentials) -> None:
        status, error = self._last_status
        if self._on_verdict is not None:
            self._on_verdict(False)
        r = self._refusal
        if r is not None and r.credentials == credentials:
            r.count += 1
            r.status, r.error = status, error
            return
        self._refusal = _Refusal(credentials, status, error, since=self._clock())
        log.error(
            "Director's OAuth token endpoint refuses the broker's credentials: every Director "
            "call fails (503 compass-unavailable) until they are fixed",
            extra={
                "endpoint": endpoint_for_logs(credentials.tokens_endpoint),
                "status": status,
                "oauth_error": error,
                "client_id": credentials.client_id,
                "credentials_file": str(self._file.path) if self._file is not None else None,
            },
        )

    def _accepted(self, credentials: DirectorCredentials) -> None:
        if self._on_verdict is not None:
            self._on_verdict(True)
        r, self._refusal = self._refusal, None
        if r is not None:
            log.warning(
                "Director's OAuth token endpoint accepts the broker's credentials again",
                extra={
                    "endpoint": endpoint_for_logs(credentials.tokens_endpoint),
                    "client_id": credentials.client_id,
                    "refused_seconds": round(self._clock() - r.since, 1),
                    "refusals": r.count,
                },
            )

    async def _fetch(self, credentials: DirectorCredentials) -> tuple[str, float]:
        started = self._clock()
        try:
            async with self._http.stream(
                "POST",
                credentials.tokens_endpoint,
                data={"grant_type": "client_credentials", "scope": self._scope},
                auth=(credentials.client_id, credentials.client_secret),
            ) as response:
                status = response.status_code
                raw = await read_capped(response, MAX_ANSWER_BYTES, what="OAuth token endpoint")
        except httpx.HTTPError as exc:
            raise DirectorRetryable(
                f"OAuth token endpoint: {describe_transport_error(exc)}"
            ) from exc
        except BodyTooLarge as exc:
            raise DirectorRetryable(str(exc)) from None
        if status != 200:
            error = oauth_error_code(raw) if status in REFUSED_STATUSES else None
            said = f"HTTP {status}" + (f" {error}" if error else "")
            # The cause names the server and the status, so the answer's log line says it.
            cause = httpx.HTTPStatusError(said, request=response.request, response=response)
            if status in REFUSED_STATUSES:
                self._last_status = (status, error)
                raise DirectorCredentialsRefused(
                    f"OAuth token endpoint refused the broker's credentials: {said}"
                ) from cause
            raise DirectorRetryable(f"OAuth token endpoint: {said}") from cause
        answer = parse_token_answer(raw)
        if answer is None:
            raise DirectorRetryable("OAuth token endpoint: malformed answer (no usable token)")
        token, expires_in = answer
        return token, refresh_at(fetched_at=started, expires_in=expires_in)
