"""The one interface the request path uses to learn who is asking, and its three implementations
wired by mode. Failures are counted by mode and reason and logged without the token."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.xfcc import identity_from_xfcc
from control_plane_broker.metrics import Metrics

log = logging.getLogger(__name__)


class Verifier(Protocol):
    mode: str

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity: ...


class XfccVerifier:
    mode = "xfcc"

    def __init__(self, *, trusted: bool, deny_list_configured: bool = False) -> None:
        self._trusted = trusted
        self._deny_list_configured = deny_list_configured

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        identity = identity_from_xfcc(headers, runtime_id=runtime_id, trusted=self._trusted)
        if self._deny_list_configured and identity.certificate_hash is None:
            # Envoy always sends the hash; without one the deny list cannot be checked, and a
            # revocation must not be skipped because a header lacks what it is checked by.
            raise IdentityNotProven(
                "the forwarded client certificate has no SHA-256 Hash to check the deny list",
                reason="no-hash",
            )
        return identity


class CountingVerifier:
    """Wraps a verifier: counts and logs every failure reason (never the proof itself)."""

    def __init__(self, inner: Verifier, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics
        self.mode = inner.mode

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        try:
            return await self._inner.verify(runtime_id=runtime_id, headers=headers)
        except (IdentityNotProven, IdentityForbidden) as exc:
            self._metrics.identity_failures.labels(self.mode, exc.reason).inc()
            log.info(
                "identity check failed",
                extra={"runtime_id": runtime_id, "mode": self.mode, "reason": exc.reason},
            )
            raise
