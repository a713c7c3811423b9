"""What the agent tells an admin through Kubernetes Events: its reasons and their types.

Always holds: an event message never contains a token; recording is best effort
(`kubeapi.EventRecorder` never fails the reconcile, the log has the same facts).
"""

from __future__ import annotations

from enum import StrEnum

COMPONENT = "compass-agent"


class EventReason(StrEnum):
    TOKEN_PULLED = "TokenPulled"  # noqa: S105 - a name, not a password
    PULL_REFUSED = "PullRefused"
    CONNECTION_FAILURE_SEEN = "ConnectionFailureSeen"
    SECRET_REMOVED = "SecretRemoved"  # noqa: S105 - a name, not a password
    RUNTIME_REVOKED = "RuntimeRevoked"
    REPORT_REFUSED = "ReportRefused"


WARNINGS = frozenset(
    {
        EventReason.PULL_REFUSED,
        EventReason.CONNECTION_FAILURE_SEEN,
        EventReason.RUNTIME_REVOKED,
        EventReason.REPORT_REFUSED,
    }
)


def event_type(reason: EventReason) -> str:
    return "Warning" if reason in WARNINGS else "Normal"
