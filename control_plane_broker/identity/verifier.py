"""The one interface the request path uses to learn who is asking, and its three implementations
wired by mode. Failures are counted by mode and reason and logged without the token. `prove` is
how a use case asks it: the caller is told when the check is over, and whether it ended because
a runtime's API server gave no answer."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven, RuntimeApiSilent
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.xfcc import identity_from_xfcc
from control_plane_broker.metrics import Metrics

log = logging.getLogger(__name__)


class Verifier(Protocol):
    mode: str

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity: ...


class IdentityChecked(Protocol):
    """Told once a request's identity check is over, passed or not: `timed_out` when it ended
    because a runtime's API server gave no answer (`RuntimeApiSilent`)."""

    def __call__(self, *, timed_out: bool) -> None: ...


async def prove(
    verifier: Verifier,
    *,
    runtime_id: str,
    headers: Mapping[str, str],
    checked: IdentityChecked | None = None,
) -> Identity:
    """`verifier.verify`, telling `checked` when the check is over (also when it failed or the
    request was cancelled): the first-contact limit in front of the app lets the next first
    contact in, and leaves a check that timed out out of its measured rate."""
    try:
        identity = await verifier.verify(runtime_id=runtime_id, headers=headers)
    except BaseException as exc:
        if checked is not None:
            checked(timed_out=isinstance(exc, RuntimeApiSilent))
        raise
    if checked is not None:
        checked(timed_out=False)
    return identity


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
    """Wraps a verifier: counts and logs every failure reason (never the proof itself), and
    remembers which runtimes proved who they are recently (`proved_recently`): checking them
    again needs no network (their keys or verdict are cached), which is all the first-contact
    limit in front of the app (`api/first_contact_middleware.py`) asks. A hint for the order of
    work, never a verdict."""

    def __init__(
        self,
        inner: Verifier,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        remember_seconds: float = 300.0,
        remember_at_most: int = 50_000,
    ) -> None:
        self._inner = inner
        self._metrics = metrics
        self._clock = clock
        self._remember_seconds = remember_seconds
        self._remember_at_most = remember_at_most
        self._proved_at: OrderedDict[str, float] = OrderedDict()  # oldest first
        self.mode = inner.mode

    def proved_recently(self, runtime_id: str) -> bool:
        proved_at = self._proved_at.get(runtime_id)
        return proved_at is not None and self._clock() - proved_at < self._remember_seconds

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        try:
            identity = await self._inner.verify(runtime_id=runtime_id, headers=headers)
        except (IdentityNotProven, IdentityForbidden) as exc:
            self._metrics.identity_failures.labels(self.mode, exc.reason).inc()
            log.info(
                "identity check failed",
                extra={"runtime_id": runtime_id, "mode": self.mode, "reason": exc.reason},
            )
            raise
        self._proved_at.pop(runtime_id, None)
        self._proved_at[runtime_id] = self._clock()
        if len(self._proved_at) > self._remember_at_most:
            self._proved_at.popitem(last=False)
        return identity
