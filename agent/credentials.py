"""The credentials the agent presents to the broker: how it proves which cluster it runs in.

The other side, checking them, is the broker's `identity` package. Here the agent only reads
and presents its own: a ServiceAccount token for the `Authorization` header, or a client
certificate on the connection.

Always holds: the projected ServiceAccount token file is re-read for every request, because
the kubelet rotates it; only without that file (outside a pod) does the agent ask the
TokenRequest API for a short-lived, audience-bound token of its own ServiceAccount, and it
reuses that token for at most half its lifetime. In mTLS mode the proof is the client
certificate on the connection and no header is sent; the certificate and key files are loaded
before the first request and re-loaded whenever they change (a mounted secret is swapped in
place), so new connections present the rotated pair. Tokens and keys are never logged.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from agent.cluster_objects import parse_time
from agent.kube import resources
from kubeapi import KubeClient

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class IdentityError(Exception):
    """No proof of identity could be produced right now (a temporary condition)."""


class Identity(Protocol):
    async def authorization(self) -> str | None:
        """The `Authorization` header value, or None when the transport carries the proof."""
        ...


@dataclass(frozen=True)
class RequestedToken:
    token: str
    expires_at: datetime


TokenRequester = Callable[[], Awaitable[RequestedToken]]


class ServiceAccountIdentity:
    def __init__(self, *, token_file: Path, requester: TokenRequester | None, clock: Clock) -> None:
        self._token_file = token_file
        self._requester = requester
        self._clock = clock
        self._cached: RequestedToken | None = None
        self._refresh_at: datetime | None = None

    async def authorization(self) -> str | None:
        return f"Bearer {await self.token()}"

    async def token(self) -> str:
        try:
            text = self._token_file.read_text().strip()
        except FileNotFoundError:
            text = ""
        except OSError as e:
            raise IdentityError(f"cannot read the ServiceAccount token file: {e.strerror}") from e
        if text:
            return text
        if self._requester is None:
            raise IdentityError("no ServiceAccount token file and no TokenRequest fallback")
        now = self._clock()
        if self._cached is None or self._refresh_at is None or now >= self._refresh_at:
            fresh = await self._requester()
            self._cached = fresh
            self._refresh_at = now + (fresh.expires_at - now) / 2
        return self._cached.token


class MtlsIdentity:
    """Keeps the broker's SSL context presenting the current client certificate and key."""

    def __init__(self, *, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        self._context = context
        self._files = (cert_file, key_file)
        self._loaded: tuple[tuple[int, int, int], ...] | None = None

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        try:
            stats = [f.stat() for f in self._files]
        except OSError as e:
            raise IdentityError(f"cannot read the client certificate or key: {e.strerror}") from e
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def refresh(self) -> bool:
        """Loads the pair when it changed since the last load; True when it (re)loaded."""
        stamp = self._stamp()
        if stamp == self._loaded:
            return False
        cert, key = self._files
        try:
            self._context.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as e:
            # Mid-rotation (new certificate, old key) or unreadable: a temporary condition.
            raise IdentityError(f"cannot load the client certificate and key: {e}") from e
        first = self._loaded is None
        self._loaded = stamp
        log.info("client certificate " + ("loaded" if first else "reloaded"))
        return True

    async def authorization(self) -> str | None:
        self.refresh()
        return None


def token_requester(
    client: KubeClient,
    *,
    namespace: str,
    service_account: str,
    audience: str,
    seconds: int,
    clock: Clock,
) -> TokenRequester:
    """TokenRequest (`serviceaccounts/token`) for the agent's own ServiceAccount."""

    async def request() -> RequestedToken:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [audience], "expirationSeconds": seconds},
        }
        answer = await client.create(resources.token_request(namespace, service_account), body)
        status = answer.get("status") or {}
        token = status.get("token")
        if not isinstance(token, str) or not token:
            raise IdentityError("TokenRequest returned no token")
        expires = parse_time(status.get("expirationTimestamp")) or clock() + timedelta(
            seconds=seconds
        )
        log.info("requested a ServiceAccount token", extra={"expires_at": expires.isoformat()})
        return RequestedToken(token=token, expires_at=expires)

    return request
