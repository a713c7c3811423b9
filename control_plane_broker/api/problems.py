"""Maps broker errors to RFC 9457 problem responses: pure (randomness passed in).

Holds: each error class maps to exactly one status and one stable `type` URI; 429 and 503 carry
`Retry-After`, the error's wait made whole seconds by `overload/retry_after` (with jitter unless
the error's wait is already spread); `detail` is the error's own message, which never holds a
secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control_plane_broker.errors import BrokerError, TemporaryError
from control_plane_broker.overload.retry_after import Jitter, header_seconds

TYPE_PREFIX = "urn:kyma-compass-pull:broker:problem:"
MEDIA_TYPE = "application/problem+json"


def type_uri(slug: str) -> str:
    return TYPE_PREFIX + slug


@dataclass(frozen=True)
class Problem:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def problem_for(exc: BrokerError, *, instance: str, jitter_max: float, rand: Jitter) -> Problem:
    headers: dict[str, str] = {}
    if isinstance(exc, TemporaryError) and exc.status in (429, 503):
        base = exc.retry_after if exc.retry_after is not None else 1.0
        spread = jitter_max if exc.spread else 0.0
        headers["Retry-After"] = str(header_seconds(base, jitter_max=spread, rand=rand))
    body = {
        "type": type_uri(exc.slug),
        "title": exc.title,
        "status": exc.status,
        "detail": str(exc),
        "instance": instance,
    }
    return Problem(status=exc.status, body=body, headers=headers)
