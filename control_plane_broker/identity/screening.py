"""Cheap refusals first, and no runtime ID takes more than its share of the identity checks.

Wraps the mode's verifier (and BYOC enrolment); every request passes here before anything that
costs a request to KCP, a runtime's API server or an issuer. In this order:

1. The bearer must be able to be a ServiceAccount token for us (`claims.screen_bearer`: a JWT,
   an algorithm an API server signs with, our audience, not expired, a ServiceAccount), judged
   from the token alone, so the answer does not depend on the runtime ID. 300 strings that were
   not even JWTs made 300 TokenReviews on one runtime's API server before.
2. The runtime ID must name a Kyma in the watch-fed cache; otherwise the caller gets the 401 a
   runtime without a kubeconfig Secret gets (`no-kubeconfig`, counted as `unknown-runtime`):
   no Secret read (500 random IDs cost 500 Secret GETs before), no memory per ID.
3. A token that proved this runtime recently goes on at once (its verdict is cached inside: no
   request), whatever follows; so an attack on a runtime never stops the runtime's own agent
   while its token lives.
4. Budget: each runtime has a bucket of failed proofs (`BROKER_IDENTITY_FAILURE_BURST`, refilled
   at `BROKER_IDENTITY_FAILURES_PER_MINUTE`). Empty, its unproven requests get 429
   `rate-limited` with the time of the next refill, with no request made. Only failures of a
   real check count (a refusal in steps 1-2 costs nothing), and a pending BYOC enrolment is no
   failure.
5. Share: at most `per_runtime` identity checks of one runtime are in flight; more get 503
   `first-contacts-busy` at once. Together with the first-contact limit's share per runtime
   (`overload/first_contact_limit.py`), one runtime ID — an attacker's favourite or a stalled
   cluster — holds at most that many of the places and checks the fleet shares.

A refusal in steps 1, 2 and 4 leaves the runtime unnamed in any state here: what is kept per
runtime (budget, proven tokens, checks in flight) is bounded (`max_runtimes`, `max_proven`) and
held only for Kymas that exist.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from control_plane_broker.errors import (
    EnrolmentPending,
    FirstContactsBusy,
    IdentityForbidden,
    IdentityNotProven,
    RateLimited,
)
from control_plane_broker.identity import claims
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.verifier import Verifier
from control_plane_broker.kyma import KymaView
from control_plane_broker.overload.rate_limit import BucketPolicy, RateLimiter

DEFAULT_PROVEN_SECONDS = 600.0  # a token without a usable expiry is remembered this long


class KymaLookup(Protocol):
    def get(self, name: str) -> KymaView | None: ...


def unknown_runtime() -> IdentityNotProven:
    # Word for word what a runtime without a kubeconfig Secret is told: who cannot prove to be
    # a runtime cannot tell an unknown runtime ID from one it failed to prove.
    return IdentityNotProven("no kubeconfig for this runtime in KCP", reason="unknown-runtime")


class ScreeningVerifier:
    def __init__(
        self,
        inner: Verifier,
        *,
        kymas: KymaLookup,
        audience: str | None,
        budget: BucketPolicy,
        per_runtime: int,
        clock: Callable[[], float],
        max_runtimes: int = 20_000,
        max_proven: int = 50_000,
    ) -> None:
        """`audience`: the bearer modes' audience; None in xfcc mode (no bearer to screen, and
        a check costs no request, so neither budget nor share applies)."""
        self._inner = inner
        self._kymas = kymas
        self._audience = audience
        self._clock = clock  # monotonic: budget, proven tokens
        self._per_runtime = per_runtime
        self._failures = RateLimiter(budget, max_keys=max_runtimes)
        self._proven: OrderedDict[str, float] = OrderedDict()  # fingerprint → until (monotonic)
        self._max_proven = max_proven
        self._in_flight: dict[str, int] = {}  # only runtimes with a check running
        self.mode = inner.mode

    def tracked(self) -> int:
        """Entries held for runtimes and tokens (for tests of the bounds)."""
        return len(self._failures) + len(self._proven) + len(self._in_flight)

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        token = None
        if self._audience is not None:
            token = claims.bearer_token(headers.get("authorization"))
            claims.screen_bearer(token, audience=self._audience, now=time.time())
        name = runtime_id.lower()
        if self._kymas.get(name) is None:
            raise unknown_runtime()
        if token is None:
            return await self._inner.verify(runtime_id=runtime_id, headers=headers)
        now = self._clock()
        fingerprint = claims.token_fingerprint(runtime_id, token)
        until = self._proven.get(fingerprint)
        if until is not None and until > now:
            return await self._inner.verify(runtime_id=runtime_id, headers=headers)
        wait = self._failures.check(name, now)
        if wait is not None:
            raise RateLimited("too many failed identity proofs for this runtime", retry_after=wait)
        if self._in_flight.get(name, 0) >= self._per_runtime:
            raise FirstContactsBusy("this runtime's identity checks are busy", retry_after=1.0)
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        try:
            identity = await self._inner.verify(runtime_id=runtime_id, headers=headers)
        except EnrolmentPending:
            raise  # awaiting an operator is no failed proof
        except (IdentityNotProven, IdentityForbidden):
            self._failures.try_take(name, self._clock())
            raise
        finally:
            left = self._in_flight.pop(name) - 1
            if left:
                self._in_flight[name] = left
        self._remember(fingerprint, identity)
        return identity

    def _remember(self, fingerprint: str, identity: Identity) -> None:
        now_wall, now = time.time(), self._clock()
        lifetime = (
            identity.expires_at - now_wall
            if identity.expires_at is not None
            else DEFAULT_PROVEN_SECONDS
        )
        self._proven[fingerprint] = now + max(0.0, min(lifetime, DEFAULT_PROVEN_SECONDS))
        self._proven.move_to_end(fingerprint)
        while len(self._proven) > self._max_proven:
            self._proven.popitem(last=False)
