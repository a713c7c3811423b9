"""What one request to the broker (a token or a connection report) can end in; plain data
shared by the client and the loop.

Always holds: `Issued` is the only place the token lives in memory after a pull, and its
`repr` never shows it. No HTTP imports here, so pure modules and benchmarks can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Issued:
    """201 from the broker: a one-time token for the Compass Connector."""

    token: str = field(repr=False)
    connector_url: str
    compass_runtime_id: str
    tenant: str
    expires_at: datetime
    issued_at: datetime


REVOKED_PROBLEM_SUFFIX = "runtime-revoked"


@dataclass(frozen=True)
class Refused:
    """A permanent answer (401/403/404/409): asking again right away would not help."""

    status: int
    reason: str  # the problem `type` (or title) the broker gave
    detail: str = ""

    @property
    def revoked(self) -> bool:
        """An operator revoked this runtime in the control plane (the contract's 403 whose
        problem `type` ends in `runtime-revoked`)."""
        return self.status == 403 and self.reason.endswith(REVOKED_PROBLEM_SUFFIX)


@dataclass(frozen=True)
class Temporary:
    """Transport error, 5xx, 429 or anything unexpected: ask again after a backoff.

    `reason` is a short, stable label (`transport: ConnectError`); `detail` what an operator
    needs besides (for a transport error: the server and the cause)."""

    reason: str
    status: int | None = None
    retry_after: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Accepted:
    """202 to a connection report; `next_report_after` is the broker's wish for the heartbeat
    (None when it stated none usable)."""

    next_report_after: float | None = None


Outcome = Issued | Refused | Temporary
ReportOutcome = Accepted | Refused | Temporary
