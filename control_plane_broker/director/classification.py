"""Director errors, part of the broker's tree (`control_plane_broker.errors`).

    CompassUnavailable ── DirectorRetryable      transport, HTTP 5xx and 429, codes 28, 32, 35
    CompassFailed      ── DirectorFailed         code 10 or 11 on an HTTP 200 answer
    CompassRejected    ── DirectorPermanent      everything else, and every other HTTP 4xx
                             ├── DirectorNotFound        code 20 (unregister treats it as done)
                             └── DirectorTenantUnknown   code 25; code 20 `[object=tenant]`

`classify` is the one place that decides which is which. The evidence, from the real Director
(kyma-incubator/compass at a423d60704, see ../shared/real-compass-notes.md):

- **Outages reach us as HTTP, not as codes.** Director's `/readyz` pings its database, so a
  Director that lost PostgreSQL leaves the Service and the gateway answers 5xx; a gateway or
  Hydra in trouble answers 5xx or 429; a lost answer is a transport error or a 5xx. These are
  `DirectorRetryable`, and the breaker counts them.
- **Codes 28 (operation timeout), 32 and 35 (concurrent operation, concurrent update)** name a
  moment, not the input: the same call may pass next time. Also `DirectorRetryable`.
- **Code 10 (InternalError) names nothing.** Director's error presenter gives code 10 to every
  error that is not one of its typed errors: a database error, but also `setRuntimeLabel` on a
  missing runtime (`Runtime with ID … doesn't exist`), a non-UUID ID, a bad cursor, a label key
  over 256 characters, the `scenarios` label, a value that fails validation. Retrying the same
  input mostly fails the same way, so it is `DirectorFailed`: the request fails (502
  `compass-failed`, no Retry-After: the agent backs off to its cap), and the breaker counts it
  only when different runtimes see it one after the other (`circuit_breaker.record_ambiguous`):
  one broken runtime must never shut Compass out for the fleet.
- **HTTP 4xx other than 429 is about the request**: 400 with code 25 (an unknown global
  account: the hydrator passed an external tenant Director cannot map), 422 with code 10 (a
  GraphQL document Director's schema refuses). Permanent.
- **Code 20 `[object=tenant]`** on `registerRuntime` is an unknown subaccount (one Director's
  tenant fetcher has not synced yet); other code 20s are a missing object. Code 27
  (InvalidOperation) is permanent; what it means depends on the call (a runtime gone, for a
  one-time token; a subaccount outside the caller's global account, for a registration), so the
  callers read it (`code`, `arguments`).
- A GraphQL error answer means Director rolled its transaction back (every resolver commits
  only on success): nothing was registered. Only an answer we did not get may hide a
  registration (`may_have_reached_director`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from control_plane_broker.errors import CompassFailed, CompassRejected, CompassUnavailable

RETRYABLE_CODES = frozenset({28, 32, 35})
INTERNAL_CODES = frozenset({10, 11})
NOT_FOUND = 20
TENANT_NOT_FOUND = 25
INVALID_OPERATION = 27

# Director's typed errors end their message with their arguments: `Object not found
# [object=tenant]`, `The operation is not allowed [object=systemAuth; reason=…]`.
_ARGUMENTS = re.compile(r"\[([A-Za-z]+=[^\[\]]*)\]\s*$")


def error_arguments(message: str) -> dict[str, str]:
    """The `[key=value; key=value]` tail of a Director error message, as a dict."""
    match = _ARGUMENTS.search(message)
    if match is None:
        return {}
    pairs = (part.split("=", 1) for part in match.group(1).split("; "))
    return {key.strip(): value.strip() for key, value in (p for p in pairs if len(p) == 2)}


class DirectorRetryable(CompassUnavailable):
    def __init__(
        self, message: str, *, retry_after: float | None = None, delivered: bool = True
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        # False only when the request certainly never reached Director (no access token, no
        # connection): registration then knows nothing can have been registered.
        self.delivered = delivered


class DirectorFailed(CompassFailed):
    """Director answered with its internal error (code 10 or 11): see the module docstring."""


class DirectorPermanent(CompassRejected):
    def __init__(
        self, message: str, *, code: int | None = None, arguments: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.arguments = arguments or {}


class DirectorNotFound(DirectorPermanent):
    pass


class DirectorTenantUnknown(DirectorPermanent):
    """Director does not know the global account (code 25) or the subaccount (code 20 with
    `object=tenant`). `subaccount` says which."""

    @property
    def subaccount(self) -> bool:
        return self.code == NOT_FOUND


def may_have_reached_director(exc: BaseException) -> bool:
    """Could the call that failed with `exc` have been carried out by Director?"""
    if isinstance(exc, DirectorRetryable):
        return exc.delivered
    # Director answered with an error, so it committed nothing; the Director limiter's refusals
    # (breaker open, no slot) are raised before any call.
    return not isinstance(exc, CompassUnavailable | DirectorFailed | DirectorPermanent)


def classify(  # noqa: PLR0911 - the table in the module docstring, row by row
    *, status: int | None, errors: Iterable[tuple[int | None, str]], message: str
) -> DirectorRetryable | DirectorFailed | DirectorPermanent | None:
    """The error for one HTTP answer (status None = transport failure) and its GraphQL errors
    as (code, message) pairs, or None when it is fine."""
    if status is None or status == 429 or status >= 500:
        return DirectorRetryable(message)
    found = list(errors)
    known = [code for code, _ in found if code is not None]
    if status >= 400 and TENANT_NOT_FOUND in known:
        return DirectorTenantUnknown(message, code=TENANT_NOT_FOUND)
    if status >= 400:
        return DirectorPermanent(message, code=known[0] if known else None)
    if not found:
        return None
    if any(code in RETRYABLE_CODES for code in known):
        return DirectorRetryable(message)
    first_code = known[0] if known else None
    arguments = error_arguments(next((text for code, text in found if code == first_code), ""))
    if TENANT_NOT_FOUND in known or (
        first_code == NOT_FOUND and arguments.get("object") == "tenant"
    ):
        code = TENANT_NOT_FOUND if TENANT_NOT_FOUND in known else NOT_FOUND
        return DirectorTenantUnknown(message, code=code, arguments=arguments)
    if any(code in INTERNAL_CODES for code in known):
        return DirectorFailed(message)
    if known and all(code == NOT_FOUND for code in known):
        return DirectorNotFound(message, code=NOT_FOUND, arguments=arguments)
    return DirectorPermanent(message, code=first_code, arguments=arguments)
