"""Director's answers classified: who caused the failure, and whether anything was written.

    CompassUnavailable ── DirectorRetryable            Compass itself, or the broker's credentials
                            ├── DirectorInternal        code 10/11 (and code 26 wrapping a failure)
                            └── DirectorCredentialsRefused  OAuth or the front door refused us
    CompassRejected    ── DirectorPermanent            an answer that says something lasting
                            ├── DirectorNotFound        about this runtime or its tenant
                            └── DirectorTenantUnknown

`classify` is the one place that decides which is which; `may_have_written` the one place that
decides whether a failed writing call may still have taken effect. The evidence is Director's
source (kyma-incubator/compass at a423d60704, `components/director/`, cited below by path) and
its answers here (docs/real-compass.md).

**One rule: a refusal only for an answer that states something lasting about this runtime or
its tenant.** Every answer caused by Compass itself (its database, its internal errors and
whatever wraps them, timeouts, gateways) or by the broker's own credentials is
`DirectorRetryable`: 503 `compass-unavailable` with Retry-After, counted by the breaker. The
rule goes by cause class, so a cause not seen yet falls on the side of asking again:

- **Transport failures, HTTP 5xx and 429** are Compass's front door or Director failing.
- **HTTP 401 and 403** come from the front door (Oathkeeper: a bearer it does not know) or from
  Director's `pkg/auth-middleware/middleware.go` (a JWT it cannot verify): the broker's
  credentials, never a runtime's. So is code 23 (insufficient scopes), and every refusal of the
  OAuth token endpoint (`director.oauth`). `DirectorCredentialsRefused`.
- **Any other 4xx without Director's GraphQL errors** is a gateway's answer, not Director's.
- **Code 10 (InternalError) and 11 (UnknownError) are Director's own failures.** The error
  presenter (`internal/error_presenter/presenter.go`) gives code 10 to every error that is not
  typed: a database that is gone (`pkg/persistence/sql_error_mapper.go` maps every SQL error
  other than a constraint violation to `Unexpected error while executing SQL query`, and a
  timeout to `Maximum processing timeout reached`), a connection broken at `COMMIT`
  (`pkg/persistence/persistence.go`: `while committing transaction: driver: bad connection`).
  It also gives it to mistakes in the input, but the broker's input is Director's own IDs and
  labels it validated: of those only `setRuntimeLabel` on a runtime gone behind our back
  (`Runtime with ID … doesn't exist`) happens, and the callers ask Director whether the runtime
  is gone (`RegistrationService.is_gone`). `DirectorInternal`: the breaker counts it only when
  different runtimes see it one after the other (`circuit_breaker.record_ambiguous`), so one
  runtime Director keeps failing never shuts Compass out for the fleet.
- **Code 26 (Unauthorized) is lasting only when it states missing access**: `Owner access is
  needed for resource modification` (`internal/repo/delete.go`, `update.go`: no row of this
  tenant's) or `does not have access to the parent resource` (`internal/repo/create.go`
  `checkParentAccess`). `createChildEntity` wraps every failure of that check in code 26: while
  its database is gone Director answers `Tenant … does not have access to the parent of the
  currently created runtimeLabel: while checking for tenant access: Internal Server Error:
  Unexpected error while executing SQL query`, which is `DirectorInternal`.
- **Codes 28 (operation timeout), 30 (inconsistent data), 32 and 35 (concurrent operation,
  update), 38 (operation in progress), 409** name a moment: `DirectorRetryable`.
- **Lasting**: code 25 (a global account Director does not know: HTTP 400 from the tenant
  check), code 20 `[object=tenant]` on `registerRuntime` (an unknown subaccount), other code
  20s (a missing object: unregistering treats it as done), 21, 22, 24, 27 (InvalidOperation: a
  runtime gone, for a one-time token; a subaccount outside the global account, for a
  registration; the callers read `code` and `arguments`), 29, 31, 33, 34, 36, 400, and HTTP 422
  (a GraphQL document Director's schema refuses: ours to fix). `DirectorPermanent`.

**What an error answer proves was not written.** Every mutation resolver the broker calls
(`internal/domain/runtime/resolver.go` `RegisterRuntime`, `DeleteRuntime` (`unregisterRuntime`),
`SetRuntimeLabel`; `internal/domain/onetimetoken/resolver.go`
`RequestOneTimeTokenForRuntime`) opens one transaction, does its work and calls `tx.Commit()`
as its last fallible step; a typed error returned before that leaves the deferred
`RollbackUnlessCommitted` to roll everything back. So:

- a typed error (any code but 10/11) on the mutation's own field, and every HTTP 4xx, prove
  nothing was written;
- code 10/11 on the mutation's field does not: a failed `COMMIT` is an untyped error (code 10,
  `reason: while committing transaction: …`), and PostgreSQL may have committed before the
  connection broke; the presenter hides the cause of a typed internal error, so no code-10
  answer can be told apart from that one;
- an error on a nested field (`path` longer than one: `registerRuntime.labels` is resolved by
  `Labels` in a transaction of its own, after the mutation committed) proves the mutation was
  written: its answer carries the new runtime's ID, which is used (`committed_data`);
- an answer not received (transport error after the request left, 5xx, a body too large to
  read) may hide anything.

`may_have_written` is True for the last three; registration then looks the runtime up by its
label before registering again (`registration.service`), once per such answer. Unregistering
asks again (a second `unregisterRuntime` of a runtime gone answers code 20: done); a label is
set again (idempotent); a one-time token is requested again (one nobody received expires
unused in 60 minutes). Each such answer to a writing call is counted
(`broker_director_uncertain_answers_total`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from control_plane_broker.errors import (
    CallerGone,
    CapacityReserved,
    CompassRejected,
    CompassUnavailable,
)

INTERNAL_CODES = frozenset({10, 11})
# Director's codes that name a moment (a timeout, a concurrent change, an operation underway).
MOMENT_CODES = frozenset({28, 30, 32, 35, 38, 409})
INSUFFICIENT_SCOPES = 23
UNAUTHORIZED = 26
NOT_FOUND = 20
TENANT_NOT_FOUND = 25
INVALID_OPERATION = 27
# The messages of code 26 that state a missing access (`pkg/apperrors/consts.go`
# ShouldBeOwnerMsg; `internal/repo/create.go` checkParentAccess), as opposed to a failure to
# check it.
_MISSING_ACCESS = ("Owner access is needed", "does not have access to the parent resource")
# Marks of a Director failure inside a message (the presenter's and the SQL mapper's words).
_FAILURE_MARKS = ("Internal Server Error", "while checking for tenant access")

# The calls that write in Director: only their uncertain answers matter.
WRITING_OPERATIONS = frozenset(
    {"registerRuntime", "unregisterRuntime", "setRuntimeLabel", "requestOneTimeTokenForRuntime"}
)

# Director's typed errors end their message with their arguments: `Object not found
# [object=tenant]`, `The operation is not allowed [object=systemAuth; reason=…]`.
_ARGUMENTS = re.compile(r"\[([A-Za-z]+=[^\[\]]*)\]\s*$")


@dataclass(frozen=True)
class AnswerError:
    """One GraphQL error of an answer: its code, message and how deep its `path` goes (1: the
    operation's own field; 2 or more: a field resolved inside its result; 0: no path)."""

    code: int | None
    message: str
    depth: int = 1


def error_arguments(message: str) -> dict[str, str]:
    """The `[key=value; key=value]` tail of a Director error message, as a dict."""
    match = _ARGUMENTS.search(message)
    if match is None:
        return {}
    pairs = (part.split("=", 1) for part in match.group(1).split("; "))
    return {key.strip(): value.strip() for key, value in (p for p in pairs if len(p) == 2)}


class DirectorRetryable(CompassUnavailable):
    """Compass or the broker's credentials failed the call; the same call may pass later."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, maybe_written: bool = False
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        # False only when the answer proves the call wrote nothing (see the module docstring).
        self.maybe_written = maybe_written


class DirectorInternal(DirectorRetryable):
    """Director's internal error (code 10/11, or code 26 wrapping one)."""


class DirectorCredentialsRefused(DirectorRetryable):
    """The OAuth token endpoint or Compass's front door refused the broker's credentials."""


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


def may_have_written(exc: BaseException) -> bool:
    """Could the writing call that failed with `exc` have taken effect in Director?"""
    if isinstance(exc, DirectorRetryable):
        return exc.maybe_written
    # An answer that says something lasting was given before the commit, and the limiter's
    # refusals (breaker open, no slot, a reservation instead of the call, the caller gone) are
    # raised before any call. Anything else (cancelled, a bug) may have broken off a call that
    # had left.
    return not isinstance(
        exc, CompassUnavailable | CapacityReserved | CallerGone | DirectorPermanent
    )


def committed(errors: Sequence[AnswerError]) -> bool:
    """Do these errors (of an answer whose operation field holds data) only concern fields
    resolved after the mutation committed?"""
    return bool(errors) and all(e.depth > 1 for e in errors)


def classify(  # noqa: PLR0911 - the rules of the module docstring, one by one
    *, status: int | None, errors: Iterable[AnswerError], message: str
) -> DirectorRetryable | DirectorPermanent | None:
    """The error for one HTTP answer (status None = transport failure, see the client for
    `maybe_written` there) and its GraphQL errors, or None when it is fine."""
    if status is None or status == 429 or status >= 500:
        return DirectorRetryable(message, maybe_written=status is not None and status >= 500)
    if status in (401, 403):
        return DirectorCredentialsRefused(message)
    found = list(errors)
    known = [e.code for e in found if e.code is not None]
    if status >= 400:
        if TENANT_NOT_FOUND in known:
            return DirectorTenantUnknown(message, code=TENANT_NOT_FOUND)
        if status == 422 or (found and status == 400):
            return DirectorPermanent(message, code=known[0] if known else None)
        return DirectorRetryable(message)  # the front door's own answer, not Director's
    if not found:
        return None
    # Anything on the operation's own field decides; errors deeper in an answer that holds
    # data are handled by the client (`committed`), and count here as Director's failure.
    own = [e for e in found if e.depth <= 1] or found
    maybe_written = any(e.depth > 1 or e.code in INTERNAL_CODES for e in found)
    return _by_cause(own, message, maybe_written=maybe_written)


def _by_cause(  # noqa: PLR0911 - one return per cause class
    errors: Sequence[AnswerError], message: str, *, maybe_written: bool
) -> DirectorRetryable | DirectorPermanent:
    codes = [e.code for e in errors]
    if any(code in INTERNAL_CODES or code is None for code in codes) or any(
        code == UNAUTHORIZED and not _states_missing_access(e.message)
        for e, code in zip(errors, codes, strict=True)
    ):
        return DirectorInternal(message, maybe_written=maybe_written)
    if INSUFFICIENT_SCOPES in codes:
        return DirectorCredentialsRefused(message)
    if any(code in MOMENT_CODES for code in codes):
        return DirectorRetryable(message)
    first = errors[0]
    arguments = error_arguments(first.message)
    if TENANT_NOT_FOUND in codes:
        return DirectorTenantUnknown(message, code=TENANT_NOT_FOUND, arguments=arguments)
    if first.code == NOT_FOUND and arguments.get("object") == "tenant":
        return DirectorTenantUnknown(message, code=NOT_FOUND, arguments=arguments)
    if all(code == NOT_FOUND for code in codes):
        return DirectorNotFound(message, code=NOT_FOUND, arguments=arguments)
    return DirectorPermanent(message, code=first.code, arguments=arguments)


def _states_missing_access(message: str) -> bool:
    return any(mark in message for mark in _MISSING_ACCESS) and not any(
        mark in message for mark in _FAILURE_MARKS
    )
