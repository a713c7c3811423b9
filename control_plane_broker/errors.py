"""The broker's one error tree. Every error the request path can end in is one of these.

    BrokerError
    ├── TemporaryError              (retry_after: seconds or None; the caller may try again)
    │   ├── CompassUnavailable      503  Compass failing or refusing our credentials, breaker open,
    │   │                                or limit reached
    │   ├── CapacityReserved        503  Director's capacity is reserved: come back when told
    │   ├── FirstContactsBusy       503  too many first contacts wait to be checked: come back later
    │   ├── RegistrationBusy        503  another replica holds the registration claim
    │   ├── NotReady                503  the Kyma cache has not synced yet
    │   ├── ControlPlaneUnavailable 503  the KCP API server could not be reached
    │   │   └── RuntimeApiSilent    503  a runtime's API server gave no answer in its timeout
    │   ├── RuntimeKubeconfigInvalid 503 the runtime's kubeconfig Secret in KCP breaks our rules
    │   ├── InternalError           503  a bug in the broker (logged); never a bare 500
    │   ├── CallerGone              503  the caller hung up before it was served or got a token
    │   └── RateLimited             429  too many token issues or connection reports for one runtime
    └── PermanentError              (the same request will fail the same way)
        ├── MalformedRequest        400  runtime ID or headers fail validation
        ├── IdentityNotProven       401  no proof, or the proof does not hold for this runtime
        ├── IdentityForbidden       403  proven, but another runtime or a ServiceAccount not allowed
        │   └── EnrolmentPending    403  BYOC: the token's issuer awaits an operator's approval
        ├── RuntimeRevoked          403  proven, but an operator revoked the runtime
        ├── RuntimeNotFound         404  no Kyma for this runtime ID
        ├── RuntimeNotRegistered    409  a connection report for a runtime without a mapping
        ├── ModuleNotEnabled        409  the application-connector module is off
        ├── KymaDeleting            409  the Kyma has a deletion timestamp
        ├── KymaIncomplete          409  the Kyma lacks the labels registration needs
        ├── CompassTenantUnknown    409  Compass knows no such global account or subaccount
        └── CompassRejected         502  Director refused the request for good

Adapters translate library errors into these once (`raise ... from exc`); the HTTP layer maps
each class to exactly one status and problem type (`api.problems`). Messages never carry tokens.
"""

from __future__ import annotations

from typing import ClassVar


class BrokerError(Exception):
    """Root of the tree. `slug` names the problem type; `status` the HTTP status."""

    slug: ClassVar[str] = "internal-error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"


class TemporaryError(BrokerError):
    # Whether Retry-After gets random extra seconds: yes for refusals a herd receives at once,
    # no where the broker has already spread the herd (a reservation, a first-contact wait).
    spread: ClassVar[bool] = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(BrokerError):
    pass


class CompassUnavailable(TemporaryError):
    slug = "compass-unavailable"
    status = 503
    title = "Compass is unavailable"


class CompassDown(CompassUnavailable):
    """Director is not served to this request now, and Retry-After is this runtime's
    reservation after the next probe while the breaker is open."""

    spread = False


class CapacityReserved(TemporaryError):
    """Director's capacity is reserved ahead (`overload/capacity_schedule`): a reservation was
    made for this runtime, and Retry-After says when to come back for it."""

    slug = "capacity-booked"
    status = 503
    title = "Compass capacity is booked; come back at the time in Retry-After"
    spread = False


class FirstContactsBusy(TemporaryError):
    """More runtimes not proven recently wait for their identity check than the first-contact
    limit lets in before the agent's timeout: answered before any work, with a wait spread over
    the queue (`overload/first_contact_limit`)."""

    slug = "first-contacts-busy"
    status = 503
    title = "Too many runtimes are being checked; come back at the time in Retry-After"
    spread = False


class RegistrationBusy(TemporaryError):
    slug = "registration-in-progress"
    status = 503
    title = "Registration of this runtime is in progress elsewhere"


class NotReady(TemporaryError):
    slug = "not-ready"
    status = 503
    title = "The broker is not ready"


class ControlPlaneUnavailable(TemporaryError):
    slug = "control-plane-unavailable"
    status = 503
    title = "The control plane API server is unavailable"


class RuntimeApiSilent(ControlPlaneUnavailable):
    """A runtime's API server gave no answer at all (a timeout, a connection that failed) to the
    identity check: what that check's time measured is the server, not how fast the broker
    checks (the first-contact limit leaves it out of its rate, docs/design/0004). The answer is
    the same as its parent's."""


class RuntimeKubeconfigInvalid(TemporaryError):
    """Not the caller's fault and not fixed by asking again soon: an operator must repair the
    Secret (the Event on the Kyma says what is wrong). 503, so agents keep coming back slowly."""

    slug = "runtime-kubeconfig-invalid"
    status = 503
    title = "The runtime's kubeconfig Secret in the control plane is unusable"


class InternalError(TemporaryError):
    slug = "internal-error"
    status = 503
    title = "The broker failed unexpectedly; try again later"


class CallerGone(TemporaryError):
    """The caller closed its connection before its request was served, or while it waited for
    Director: proving its identity or requesting its token would be work for nobody (one-time
    tokens are not handed to the next caller). Nobody reads the answer; it exists for the
    access log and the metric."""

    slug = "caller-gone"
    status = 503
    title = "The caller closed the connection before it was answered"


class RateLimited(TemporaryError):
    slug = "rate-limited"
    status = 429
    title = "Too many requests for this runtime"


class MalformedRequest(PermanentError):
    slug = "malformed-request"
    status = 400
    title = "Malformed request"


class IdentityNotProven(PermanentError):
    """`reason` is a short, fixed metric label such as `token-invalid`."""

    slug = "identity-not-proven"
    status = 401
    title = "Cluster identity not proven"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class IdentityForbidden(PermanentError):
    slug = "identity-forbidden"
    status = 403
    title = "Identity not allowed for this runtime"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EnrolmentPending(IdentityForbidden):
    """A runtime without a kubeconfig Secret in KCP presented a ServiceAccount issuer that no
    operator approved for it (yet). 403: the caller has not proven anything the broker accepts,
    and asking again changes nothing until an operator acts."""

    slug = "enrolment-pending"
    title = "The runtime's ServiceAccount issuer awaits approval in the control plane"

    def __init__(self, message: str, *, reason: str = "enrolment-pending") -> None:
        super().__init__(message, reason=reason)


class RuntimeRevoked(PermanentError):
    """An operator revoked the runtime (annotation on its mapping, or its client certificate on
    the xfcc deny list). Raised only after the caller proved to be this runtime, so it tells an
    unproven caller nothing."""

    slug = "runtime-revoked"
    status = 403
    title = "The runtime is revoked in the control plane"

    def __init__(self, message: str, *, source: str = "annotation") -> None:
        super().__init__(message)
        self.source = source  # annotation | deny-list: a fixed metric label


class RuntimeNotFound(PermanentError):
    slug = "runtime-not-found"
    status = 404
    title = "No Kyma for this runtime"


class RuntimeNotRegistered(PermanentError):
    """A connection report for a runtime that has no mapping yet: there is nothing to record it
    on, and the broker creates mappings only to register (the first token request does)."""

    slug = "runtime-not-registered"
    status = 409
    title = "The runtime has no mapping in the control plane yet"


class ModuleNotEnabled(PermanentError):
    slug = "module-not-enabled"
    status = 409
    title = "The application-connector module is not enabled"


class KymaDeleting(PermanentError):
    slug = "kyma-deleting"
    status = 409
    title = "The Kyma is being deleted"


class KymaIncomplete(PermanentError):
    slug = "kyma-incomplete"
    status = 409
    title = "The Kyma lacks data needed for registration"


class CompassTenantUnknown(PermanentError):
    """Director does not know the global account or the subaccount the Kyma names. Asking again
    costs Director nothing until the Kyma's labels change or the recheck period passes (a
    subaccount appears once Compass's tenant fetcher syncs it)."""

    slug = "compass-tenant-unknown"
    status = 409
    title = "Compass does not know the Kyma's global account or subaccount"

    def __init__(self, message: str, *, label: str, value: str) -> None:
        super().__init__(message)
        self.label = label
        self.value = value


class CompassRejected(PermanentError):
    slug = "compass-rejected"
    status = 502
    title = "Compass rejected the request"

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
