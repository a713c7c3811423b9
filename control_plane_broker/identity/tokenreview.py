"""Identity by TokenReview on the runtime's own API server (default mode).

The caller's ServiceAccount token is sent to the API server of the runtime it claims to be
(found through that runtime's kubeconfig Secret in KCP) with the configured audience. A token of
another cluster is not valid there, so it cannot pass. Positive verdicts are cached under a hash
of (runtime ID, token) until the token expires; the token itself is never stored or logged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

import httpx

from control_plane_broker.errors import ControlPlaneUnavailable, IdentityNotProven, RuntimeApiSilent
from control_plane_broker.identity import claims
from control_plane_broker.identity.claims import Identity
from control_plane_broker.kube.runtime_access import RuntimeAccess
from kubeapi import KubeError, KubeUnavailable

TOKENREVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


def did_not_answer(exc: KubeUnavailable) -> bool:
    """A timeout or a connection that failed: the server gave no answer at all (a 5xx is one)."""
    return isinstance(exc.__cause__, httpx.TransportError)


class TokenReviewVerifier:
    mode = "tokenreview"

    def __init__(
        self,
        access: RuntimeAccess,
        *,
        audience: str,
        allowed: frozenset[tuple[str, str]],
        cache_max_seconds: float,
        clock: Callable[[], float],
        max_entries: int = 10_000,
    ) -> None:
        self._access = access
        self._audience = audience
        self._allowed = allowed
        self._cache_max = cache_max_seconds
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        self._max = max_entries

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        token = claims.bearer_token(headers.get("authorization"))
        now = self._clock()
        key = claims.token_fingerprint(runtime_id, token)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        client = await self._access.client_for(runtime_id)
        silent = self._access.unreachable_for(client)
        if silent is not None:
            # Answered at once: waiting for a server that just let a request time out would
            # hold a first-contact place for the whole timeout, for every caller.
            raise ControlPlaneUnavailable(
                "the runtime API server did not answer recently", retry_after=silent
            )
        try:
            review = await client.create(
                TOKENREVIEW_PATH,
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token, "audiences": [self._audience]},
                },
            )
        except KubeUnavailable as exc:
            if not did_not_answer(exc):
                raise ControlPlaneUnavailable(
                    "runtime API server unreachable", retry_after=5
                ) from exc
            self._access.note_unreachable(client)
            raise RuntimeApiSilent("runtime API server unreachable", retry_after=5) from exc
        except KubeError as exc:
            raise IdentityNotProven(
                "the runtime API server refused the review", reason="review-refused"
            ) from exc
        status = review.get("status") or {}
        if not status.get("authenticated"):
            # The server does not say why; the unverified claims tell expired, wrong
            # audience or garbage (401) from another cluster's token (403).
            raise claims.refusal_for_foreign_token(token, audience=self._audience, now=now)
        claims.check_audience(status.get("audiences") or [], self._audience)
        username = str((status.get("user") or {}).get("username", ""))
        claims.check_service_account(username, self._allowed)
        expiry = claims.unverified_expiry(token)
        identity = Identity(
            runtime_id=runtime_id, subject=username, mode=self.mode, expires_at=expiry
        )
        self._cache[key] = (
            claims.cache_until(now=now, token_expiry=expiry, max_seconds=self._cache_max),
            identity,
        )
        self._evict(now)
        return identity

    def _evict(self, now: float) -> None:
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        for key in [k for k, (until, _) in list(self._cache.items())[:64] if until <= now]:
            del self._cache[key]
