"""Director errors, part of the broker's tree (`control_plane_broker.errors`).

    CompassUnavailable ── DirectorRetryable   transport, 5xx, 429, codes 10, 28, 32, 35
    CompassRejected    ── DirectorPermanent   everything else
                             └── DirectorNotFound   code 20 (unregister treats it as done)

`classify` is the one place that decides which is which.
"""

from __future__ import annotations

from collections.abc import Iterable

from control_plane_broker.errors import CompassRejected, CompassUnavailable

RETRYABLE_CODES = frozenset({10, 28, 32, 35})
NOT_FOUND = 20


class DirectorRetryable(CompassUnavailable):
    def __init__(
        self, message: str, *, retry_after: float | None = None, delivered: bool = True
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        # False only when the request certainly never reached Director (no access token, no
        # connection): registration then knows nothing can have been registered.
        self.delivered = delivered


def may_have_reached_director(exc: BaseException) -> bool:
    """Could the call that failed with `exc` have been carried out by Director?"""
    if isinstance(exc, DirectorRetryable):
        return exc.delivered
    # The guard's own refusals (breaker open, no slot) are raised before any call.
    return not isinstance(exc, CompassUnavailable)


class DirectorPermanent(CompassRejected):
    pass


class DirectorNotFound(DirectorPermanent):
    pass


def classify(
    *, status: int | None, codes: Iterable[int | None], message: str
) -> DirectorRetryable | DirectorPermanent | None:
    """The error for one HTTP answer (status None = transport failure), or None when it is fine."""
    if status is None or status == 429 or status >= 500:
        return DirectorRetryable(message)
    code_list = list(codes)
    if status >= 400 and not code_list:
        return DirectorPermanent(message)
    if not code_list:
        return None
    known = [c for c in code_list if c is not None]
    if any(c in RETRYABLE_CODES for c in known):
        return DirectorRetryable(message)
    if known and all(c == NOT_FOUND for c in known):
        return DirectorNotFound(message, code=NOT_FOUND)
    return DirectorPermanent(message, code=known[0] if known else None)
