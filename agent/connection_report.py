"""Connection reports: what the agent tells the broker about its runtime's Compass connection
(`POST /v1/runtimes/{id}/connection`), and when.

A report says `connectionState` (a CompassConnection state, or `NotFound` while there is none,
or while it says `ConnectionFailed` and the runtime holds no token secret: nothing was tried),
the client certificate's `notAfter`, the runtime agent's last error, the SHA-256 of the last
token the agent wrote, and when it read all that. It is sent when the first four change and
otherwise as a heartbeat every `min(AGENT_REPORT_INTERVAL_SECONDS, the broker's
nextReportAfterSeconds)` ± 20 %. A failed report backs off with THE retry policy
(`agent.retry_policy.next_delay`, `Retry-After` honoured); a change waits for that backoff too.

Always holds: pure (the clock and randomness come in as arguments); building a report from any
CompassConnection, however hostile its contents, never raises, and the body is valid UTF-8 JSON
of at most 4 KiB with only the contract's fields; the token itself is never part of a report.
No Kubernetes or HTTP imports.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from agent.cluster_objects import Connection, ConnectionState, TokenRecord, format_time
from agent.retry_policy import RandomSource, RetryPolicy, jittered, next_delay

NOT_FOUND = "NotFound"
REPORTABLE_STATES = frozenset(str(s) for s in ConnectionState)
MAX_ERROR_CHARS = 1024
MAX_BODY_BYTES = 4096
# How much of an unknown state is quoted back in `lastError` (the state itself is not sent).
_QUOTED_STATE_CHARS = 100
# C0 controls but tab and newline, and DEL: nothing a human reads, but each costs six bytes of
# JSON escape and some break the tools an operator reads the mapping with.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

ReportKey = tuple[str, str | None, str | None, str | None]


def _clean(text: str, limit: int) -> str:
    # A lone surrogate (JSON may carry "\ud800") cannot be encoded as UTF-8: replaced first.
    text = text[: limit * 2].encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub(" ", text)[:limit]


@dataclass(frozen=True)
class ConnectionReport:
    connection_state: str
    certificate_not_after: datetime | None
    last_error: str | None
    token_sha256: str | None
    observed_at: datetime

    @property
    def key(self) -> ReportKey:
        """What a change is judged by (`observedAt` is not part of it)."""
        not_after = self.certificate_not_after
        return (
            self.connection_state,
            None if not_after is None else format_time(not_after),
            self.last_error,
            self.token_sha256,
        )

    def body(self) -> bytes:
        """The JSON request body: optional fields left out when unknown, at most 4 KiB (the
        error is shortened further if multi-byte characters would make it longer)."""
        error = self.last_error
        while True:
            document: dict[str, str] = {"connectionState": self.connection_state}
            if self.certificate_not_after is not None:
                document["certificateNotAfter"] = format_time(self.certificate_not_after)
            if error:
                document["lastError"] = error
            if self.token_sha256 is not None:
                document["tokenSha256"] = self.token_sha256
            document["observedAt"] = format_time(self.observed_at)
            encoded = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
            if len(encoded) <= MAX_BODY_BYTES or not error:
                return encoded
            # A character is at most four bytes here (controls were replaced): cutting a
            # quarter of the excess in characters never cuts more than needed.
            excess = len(encoded) - MAX_BODY_BYTES
            error = error[: len(error) - max(excess // 4, 1)]


def build_report(
    connection: Connection | None, token: TokenRecord | None, *, now: datetime
) -> ConnectionReport:
    """The report for what the agent observed at `now` (`connection`: the parsed
    CompassConnection, None when there is none; `token`: the token secret's record)."""
    digest = token.token_sha256 if token is not None else None
    if connection is None:
        return ConnectionReport(NOT_FOUND, None, None, digest, now)
    error = _clean(connection.error, MAX_ERROR_CHARS) if connection.error else None
    state = connection.state
    if state not in REPORTABLE_STATES:
        # No state (yet), or one the contract does not know (the broker would refuse the whole
        # report): said as NotFound — not connected — with the reason in the error when the
        # runtime agent gave none.
        if error is None:
            error = (
                "CompassConnection has no status.connectionState"
                if state is None
                else "CompassConnection has an unknown connectionState: "
                + _clean(state, _QUOTED_STATE_CHARS)
            )
        state = NOT_FOUND
    elif token is None and state == ConnectionState.CONNECTION_FAILED:
        # No token secret: compass-runtime-agent had nothing to try (it runs only while the
        # secret exists, so its failure is about no token, or an old one). Said as not tried
        # yet, so the control plane shows a runtime waiting for its token, not a failed one.
        said = "no token in the runtime yet"
        error = (f"{said}; CompassConnection: {error}" if error else said)[:MAX_ERROR_CHARS]
        state = NOT_FOUND
    return ConnectionReport(state, connection.certificate_not_after, error, digest, now)


# -- when -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """What the agent remembers about reporting (in memory: a restarted agent reports at once)."""

    accepted: ReportKey | None = None  # what the broker last accepted
    heartbeat_at: datetime | None = None  # when the accepted state is due again
    not_before: datetime | None = None  # no report before this (a backoff after a failure)
    failures: int = 0  # failed reports in a row


def due_at(schedule: Schedule, key: ReportKey, *, now: datetime) -> datetime:
    """When the report with `key` should go: at once on a change, else at the heartbeat; never
    before a backoff is over."""
    if schedule.accepted is None or key != schedule.accepted or schedule.heartbeat_at is None:
        wanted = now
    else:
        wanted = schedule.heartbeat_at
    if schedule.not_before is not None and schedule.not_before > wanted:
        return schedule.not_before
    return wanted


def heartbeat_period(interval: float, broker_wish: float | None) -> float:
    return interval if broker_wish is None else min(interval, broker_wish)


def after_accepted(
    key: ReportKey,
    *,
    now: datetime,
    interval: float,
    broker_wish: float | None,
    rng: RandomSource | None = None,
) -> Schedule:
    period = jittered(heartbeat_period(interval, broker_wish), rng=rng)
    return Schedule(accepted=key, heartbeat_at=now + timedelta(seconds=period))


def after_failure(
    schedule: Schedule,
    *,
    now: datetime,
    policy: RetryPolicy,
    retry_after: float | None = None,
    rng: RandomSource | None = None,
) -> Schedule:
    failures = schedule.failures + 1
    delay = next_delay(policy, failures, retry_after=retry_after, rng=rng)
    return replace(schedule, failures=failures, not_before=now + timedelta(seconds=delay))
