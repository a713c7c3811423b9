"""The identity stage of overload protection: no runtime ID takes more than its share of the
identity checks, and failed proofs have a budget.

Wraps a bearer mode's verifier (and BYOC enrolment), behind the cheap refusals of
`identity/screening` (a bearer that cannot be a ServiceAccount token, a runtime ID with no
Kyma), which cost nothing and count nothing here. In this order:

1. A token that proved this runtime recently goes on at once (its verdict is cached inside: no
   request), whatever follows; so an attack on a runtime never stops the runtime's own agent
   while its token lives.
2. Budget: each runtime has a bucket of failed proofs (`BROKER_IDENTITY_FAILURE_BURST`, refilled
   at `BROKER_IDENTITY_FAILURES_PER_MINUTE`). Empty, its unproven requests get 429
   `rate-limited` with the time of the next refill, with no request made. Only failures of a
   real check count, and a pending BYOC enrolment is no failure.
3. Share: at most `per_runtime` identity checks of one runtime are in flight; more get 503
   `first-contacts-busy` at once. Together with the first-contact limit's share per runtime
   (`overload/first_contact_limit.py`), one runtime ID — an attacker's favourite or a stalled
   cluster — holds at most that many of the places and checks the fleet shares.

Holds: what is kept per runtime (budget, proven tokens, checks in flight) is bounded
(`max_runtimes`, `max_proven`), and a runtime's checks in flight are kept only while one runs.
Not in xfcc mode: there is no bearer, and a check costs no request.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

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
from control_plane_broker.overload.rate_limit import BucketPolicy, RateLimiter

DEFAULT_PROVEN_SECONDS = 600.0  # a token without a usable expiry is remembered this long


class IdentityBudget:
    def __init__(
        self,
        inner: Verifier,
        *,
        budget: BucketPolicy,
        per_runtime: int,
        clock: Callable[[], float],
        max_runtimes: int = 20_000,
        max_proven: int = 50_000,
    ) -> None:
        self._inner = inner
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
        token = claims.bearer_token(headers.get("authorization"))
        name = runtime_id.lower()
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
