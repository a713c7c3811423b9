"""OAuth2 client-credentials token endpoint and bearer-token checks (RFC 6749).

- The client authenticates with HTTP Basic auth only (`client_secret_basic`);
  unknown client or wrong secret: 401 `invalid_client` with `WWW-Authenticate`.
- Form body: `grant_type=client_credentials` (else 400 `unsupported_grant_type` or
  `invalid_request`), optional `scope` (space-separated). The token carries exactly
  the scopes requested, which must be among the client's scopes (else 400
  `invalid_scope`); with no `scope` the token has none, as with Compass's Hydra.
- Access tokens are opaque random strings; only their SHA-256 is kept. They expire
  after the configured TTL; the response says `expires_in` and `token_type` bearer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote_plus

from pydantic import BaseModel, ConfigDict, SecretStr

from .calls import Call
from .errors import DirectorError
from .operations import OAUTH_TOKEN

__all__ = ["AccessTokenRecord", "BearerError", "OAuthResult", "OAuthServer", "hash_token"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AccessTokenRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    token_hash: str
    client_id: str
    scopes: frozenset[str]
    expires_at: float  # epoch seconds


class BearerError(Exception):
    """Missing, unknown or expired bearer token (Director error 26)."""


@dataclass
class OAuthResult:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    client_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


def _error(status: int, error: str, description: str, **headers: str) -> OAuthResult:
    return OAuthResult(
        status, {"error": error, "error_description": description}, {**_NO_STORE, **headers}
    )


class OAuthServer:
    def __init__(
        self,
        *,
        client_id: str,
        client_secret: SecretStr,
        client_scopes: tuple[str, ...],
        ttl_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._client_id = client_id
        self._client_secret = client_secret
        self._client_scopes = frozenset(client_scopes)
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, AccessTokenRecord] = {}
        self.version = 0

    def handle(self, *, authorization: str | None, body: bytes, call: Call) -> OAuthResult:
        client_id = self._authenticate_client(authorization)
        if client_id is None:
            return _error(
                401,
                "invalid_client",
                "client authentication failed",
                **{"WWW-Authenticate": 'Basic realm="compass-sim"'},
            )
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        grant_type = form.get("grant_type", [None])[0]
        if grant_type is None:
            return _error(400, "invalid_request", "grant_type is required")
        if grant_type != "client_credentials":
            return _error(400, "unsupported_grant_type", "only client_credentials is supported")
        requested = frozenset(" ".join(form.get("scope", [])).split())
        unknown = requested - self._client_scopes
        if unknown:
            return _error(400, "invalid_scope", f"scope not allowed: {' '.join(sorted(unknown))}")
        try:
            call.enter(OAUTH_TOKEN)
        except DirectorError:
            return _error(500, "server_error", "injected failure")
        token, expires_in = self.issue(client_id, requested)
        call.done(OAUTH_TOKEN)
        return OAuthResult(
            200,
            {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": expires_in,
                "scope": " ".join(sorted(requested)),
            },
            dict(_NO_STORE),
            client_id=client_id,
        )

    def _authenticate_client(self, authorization: str | None) -> str | None:
        if not authorization or not authorization.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        raw_id, sep, raw_secret = decoded.partition(":")
        if not sep:
            return None
        # RFC 6749 2.3.1: id and secret are form-urlencoded before Basic encoding.
        client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        expected = self._client_secret.get_secret_value()
        id_ok = hmac.compare_digest(client_id.encode(), self._client_id.encode())
        secret_ok = hmac.compare_digest(secret.encode(), expected.encode())
        return client_id if id_ok and secret_ok else None

    def issue(self, client_id: str, scopes: frozenset[str]) -> tuple[str, int]:
        token = secrets.token_urlsafe(32)
        record = AccessTokenRecord(
            token_hash=hash_token(token),
            client_id=client_id,
            scopes=scopes,
            expires_at=self._clock() + self._ttl,
        )
        with self._lock:
            self._tokens[record.token_hash] = record
            self.version += 1
        return token, max(1, round(self._ttl))

    def check_bearer(self, authorization: str | None) -> AccessTokenRecord:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise BearerError("missing bearer token")
        token = authorization[7:].strip()
        with self._lock:
            record = self._tokens.get(hash_token(token))
            if record is None:
                raise BearerError("invalid bearer token")
            if record.expires_at <= self._clock():
                del self._tokens[record.token_hash]
                raise BearerError("bearer token has expired")
            return record

    def to_storage(self) -> list[dict[str, Any]]:
        now = self._clock()
        with self._lock:
            return [r.model_dump(mode="json") for r in self._tokens.values() if r.expires_at > now]

    def load_storage(self, data: list[dict[str, Any]]) -> None:
        records = [AccessTokenRecord.model_validate(item) for item in data]
        with self._lock:
            self._tokens = {r.token_hash: r for r in records}
