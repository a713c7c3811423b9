"""Cheap refusals first: what a request's bearer and runtime ID alone show is answered before
anything that costs a request to KCP, a runtime's API server or an issuer.

Wraps the mode's verifier (in the bearer modes behind the identity budget,
`overload/identity_budget`); every request passes here first. In this order:

1. The bearer must be able to be a ServiceAccount token for us (`claims.screen_bearer`: a JWT,
   an algorithm an API server signs with, our audience, not expired, a ServiceAccount), judged
   from the token alone, so the answer does not depend on the runtime ID. 300 strings that were
   not even JWTs made 300 TokenReviews on one runtime's API server before.
2. The runtime ID must name a Kyma in the watch-fed cache; otherwise the caller gets the 401 a
   runtime without a kubeconfig Secret gets (`no-kubeconfig`, counted as `unknown-runtime`):
   no Secret read (500 random IDs cost 500 Secret GETs before), no memory per ID.

A refusal here keeps nothing, and costs nothing of the runtime's identity budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from control_plane_broker.errors import IdentityNotProven
from control_plane_broker.identity import claims
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.verifier import Verifier
from control_plane_broker.kyma import KymaView


class KymaLookup(Protocol):
    def get(self, name: str) -> KymaView | None: ...


def unknown_runtime() -> IdentityNotProven:
    # Word for word what a runtime without a kubeconfig Secret is told: who cannot prove to be
    # a runtime cannot tell an unknown runtime ID from one it failed to prove.
    return IdentityNotProven("no kubeconfig for this runtime in KCP", reason="unknown-runtime")


class ScreeningVerifier:
    def __init__(self, inner: Verifier, *, kymas: KymaLookup, audience: str | None) -> None:
        """`audience`: the bearer modes' audience; None in xfcc mode (no bearer to screen)."""
        self._inner = inner
        self._kymas = kymas
        self._audience = audience
        self.mode = inner.mode

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        if self._audience is not None:
            token = claims.bearer_token(headers.get("authorization"))
            claims.screen_bearer(token, audience=self._audience, now=time.time())
        if self._kymas.get(runtime_id.lower()) is None:
            raise unknown_runtime()
        return await self._inner.verify(runtime_id=runtime_id, headers=headers)
