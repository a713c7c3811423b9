"""Connection reports and the fleet's connection health: pure decisions on a mapping.

What always holds:
- a report is recorded in `status.connection` only when something but its times changed, or when
  the recorded `lastReportAt` is older than the refresh interval: a steady heartbeat costs one
  KCP write per refresh interval, not one per report;
- a report observed before the recorded one is ignored (the agent's own clock orders its
  reports; a time in the future counts as now), so a late retry never overwrites a newer state;
- condition `Connected` says what the last report said (reason = its state, message = its error),
  except for a runtime that was handed a token and has not reported Connected since, for
  longer than the connect deadline: then `False` with reason `NotConnectedAfterToken`. Reports
  and the leader's periodic check judge with the same function, so they never undo each other;
- a runtime that reports no CompassConnection (`NotFound`) and has no token (none issued by the
  broker, none written by its agent) is `Connected` `False` with reason `AwaitingToken`: the
  printer column STATE shows the reason, so such a runtime never reads as a failed connection;
- a revoked runtime (the operator's annotation on its mapping) is `Connected` `False` with reason
  `Revoked` whatever it last reported: its tokens and reports are refused, so `kubectl get` must
  not go on showing it connected; lifting the revocation gives the last report's word back (or
  no `Connected` condition, when it never reported);
- condition `ReportsStale` is `True` once the recorded last report is older than the stale bound,
  and turns `False` again with the next recorded report; it exists only once it was `True`;
- a Warning Event is due only when one of these two conditions newly says so: `Connected`
  newly `False` because the runtime reports `ConnectionFailed` or `ConnectionMaintenanceFailed`
  (`RuntimeConnectionFailed`, with its error) or because no connected report came in time
  (`RuntimeNotConnected`), `ReportsStale` newly `True` (`ConnectionReportsStale`);
- the runtime's free text (`lastError`) reaches the status, a condition or an Event only without
  control and bidi characters (`text.for_humans`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from control_plane_broker.registration import state
from control_plane_broker.registration.state import ConnectionRecord, Mapping
from control_plane_broker.revocation import revocation_rules
from control_plane_broker.text import for_humans

# The CompassConnection states (status.connectionState), and NotFound when there is none.
NOT_FOUND = "NotFound"
CONNECTED_STATES = frozenset(
    {
        "Connected",
        "Synchronized",
        "SynchronizationFailed",
        "ResourceApplicationFailed",
        "MetadataUpdateFailed",
    }
)
NOT_CONNECTED_STATES = frozenset({"ConnectionFailed", "ConnectionMaintenanceFailed", NOT_FOUND})
STATES = tuple(sorted(CONNECTED_STATES | NOT_CONNECTED_STATES))
UNKNOWN = "unknown"  # the fleet gauge's label for a runtime that never reported

CONNECTED = "Connected"
REPORTS_STALE = "ReportsStale"
NOT_CONNECTED_AFTER_TOKEN = "NotConnectedAfterToken"  # noqa: S105 (a reason, no secret)
REVOKED = "Revoked"
AWAITING_TOKEN = "AwaitingToken"  # noqa: S105 (a reason, no secret)
EVENT_NOT_CONNECTED = "RuntimeNotConnected"
EVENT_CONNECTION_FAILED = "RuntimeConnectionFailed"
# Reported states that mean the runtime tried and failed to connect (NotFound: not tried yet).
FAILED_STATES = frozenset({"ConnectionFailed", "ConnectionMaintenanceFailed"})
EVENT_REPORTS_STALE = "ConnectionReportsStale"


def is_connected(connection_state: str) -> bool:
    return connection_state in CONNECTED_STATES


@dataclass(frozen=True)
class Report:
    """A connection report as the agent sent it, validated (times as epoch seconds)."""

    state: str
    observed_at: float
    certificate_not_after: str | None = None  # RFC 3339, normalised to whole seconds, UTC
    last_error: str | None = None
    token_sha256: str | None = None


@dataclass(frozen=True)
class Limits:
    refresh_seconds: float
    stale_seconds: float
    connect_deadline_seconds: float


@dataclass(frozen=True)
class WarningEvent:
    """A Warning Event to emit on the Kyma (aggregated by the recorder)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Change:
    status: dict[str, Any]  # the merge patch of the mapping's status
    events: tuple[WarningEvent, ...] = ()


def _content(record: ConnectionRecord) -> tuple[object, ...]:
    return (
        record.state,
        record.certificate_not_after,
        record.last_error,
        record.token_sha256,
    )


def record_report(mapping: Mapping, report: Report, *, now: float, limits: Limits) -> Change | None:
    """What to write for `report` on `mapping`, or None when the record already says it."""
    before = mapping.connection
    observed = min(report.observed_at, now)
    if before is not None and before.observed_at is not None and observed < before.observed_at:
        return None
    connected = is_connected(report.state)
    after = ConnectionRecord(
        state=report.state,
        connected=connected,
        certificate_not_after=report.certificate_not_after,
        # The runtime's own text: stored, shown in a condition and an Event, read in terminals.
        last_error=for_humans(report.last_error) if report.last_error is not None else None,
        token_sha256=report.token_sha256,
        observed_at=observed,
        last_report_at=now,
        last_connected_at=now if connected else (before.last_connected_at if before else None),
    )
    conditions, events = judge(mapping, after, now=now, limits=limits, tell_failures=True)
    conditions_changed = conditions != state.conditions_of(mapping)
    fresh = (
        before is not None
        and before.last_report_at is not None
        and now - before.last_report_at < limits.refresh_seconds
    )
    status: dict[str, Any] = {}
    if not (before is not None and _content(before) == _content(after) and fresh):
        status["connection"] = after.to_status()
    if conditions_changed:
        status["conditions"] = conditions
    return Change(status=status, events=events) if status else None


def check(mapping: Mapping, *, now: float, limits: Limits) -> Change | None:
    """The leader's periodic judgement: the conditions to write as time passes, or None."""
    conditions, events = judge(mapping, mapping.connection, now=now, limits=limits)
    if conditions == state.conditions_of(mapping):
        return None
    return Change(status={"conditions": conditions}, events=events)


def judge(
    mapping: Mapping,
    record: ConnectionRecord | None,
    *,
    now: float,
    limits: Limits,
    tell_failures: bool = False,
) -> tuple[list[dict[str, Any]], tuple[WarningEvent, ...]]:
    """The mapping's conditions with `Connected` and `ReportsStale` as `record` and the time say,
    and the Events that are news. `tell_failures`: a report just said the runtime failed to
    connect (the periodic check, which only sees time pass, does not tell it again, nor a
    failure recorded before this broker told such failures)."""
    before = state.conditions_of(mapping)
    after = before
    warnings: list[WarningEvent] = []
    generation = state.generation_of(mapping)

    connected = _revoked_condition(mapping) or _connected_condition(
        record, mapping.last_token_issued_at, now=now, limits=limits
    )
    if connected is not None:
        status, reason, message = connected
        set_connected = state.with_condition(
            after,
            state.Condition(CONNECTED, status, reason, message),
            now=now,
            generation=generation,
        )
        after = set_connected.conditions
        if set_connected.news and reason == NOT_CONNECTED_AFTER_TOKEN:
            warnings.append(WarningEvent(EVENT_NOT_CONNECTED, message))
        elif set_connected.news and tell_failures and not status and reason in FAILED_STATES:
            said = f"the runtime reports {reason}"
            error = for_humans(record.last_error or "") if record is not None else ""
            text = f"{said}: {error}" if error else said
            warnings.append(WarningEvent(EVENT_CONNECTION_FAILED, text))
    elif (state.find_condition(before, CONNECTED) or {}).get("reason") == REVOKED:
        # Revocation lifted from a runtime that never reported: nothing is known, say nothing.
        after = [c for c in after if c.get("type") != CONNECTED]

    # A revoked runtime's reports are refused: their absence is no news.
    stale = (
        None
        if mapping.revoked is not None
        else _stale_condition(record, state.find_condition(before, REPORTS_STALE), now, limits)
    )
    if stale is not None:
        status, reason, message = stale
        set_stale = state.with_condition(
            after,
            state.Condition(REPORTS_STALE, status, reason, message),
            now=now,
            generation=generation,
        )
        after = set_stale.conditions
        if set_stale.news and status:
            warnings.append(WarningEvent(EVENT_REPORTS_STALE, message))
    return after, tuple(warnings)


def _revoked_condition(mapping: Mapping) -> tuple[bool, str, str] | None:
    said = revocation_rules.revoked(mapping, certificate_hash=None, deny=frozenset())
    return None if said is None else (False, REVOKED, for_humans(said.detail))


def _connected_condition(
    record: ConnectionRecord | None, token_at: float | None, *, now: float, limits: Limits
) -> tuple[bool, str, str] | None:
    stuck = (
        token_at is not None
        and now - token_at >= limits.connect_deadline_seconds
        and not (record is not None and record.connected)
        and (
            record is None
            or record.last_connected_at is None
            or record.last_connected_at < token_at
        )
    )
    if stuck:
        assert token_at is not None
        message = (
            f"no Connected report within {limits.connect_deadline_seconds:g} s of the one-time "
            f"token issued at {state.to_rfc3339(token_at)}"
        )
        if record is not None:
            message += f"; the runtime reports {record.state}"
            if record.last_error:
                message += f": {for_humans(record.last_error)}"
        return False, NOT_CONNECTED_AFTER_TOKEN, message
    if record is None:
        return None
    if record.state == NOT_FOUND and token_at is None and record.token_sha256 is None:
        # Not tried yet because there is nothing to try with: neither did this broker issue a
        # token nor does the runtime hold one the agent wrote.
        said = "no one-time token in the runtime yet"
        error = for_humans(record.last_error or "")
        return False, AWAITING_TOKEN, f"{said}; {error}" if error else said
    # A record written before reports were cleaned may still hold control characters.
    return (
        record.connected,
        record.state,
        for_humans(record.last_error or "") or f"the runtime reports {record.state}",
    )


def _stale_condition(
    record: ConnectionRecord | None,
    existing: dict[str, Any] | None,
    now: float,
    limits: Limits,
) -> tuple[bool, str, str] | None:
    last = record.last_report_at if record is not None else None
    if last is not None and now - last >= limits.stale_seconds:
        # A fixed message (the time of the last report, not its age): judging again writes
        # nothing until something really changes.
        return (
            True,
            "NoRecentReport",
            f"no connection report recorded since {state.to_rfc3339(last)} "
            f"(limit {limits.stale_seconds:g} s)",
        )
    if existing is not None and existing.get("status") == "True":
        return False, "ReportsReceived", "connection reports arrive again"
    return None


# --- the fleet, for metrics --------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    by_state: dict[str, int]  # every state in STATES and UNKNOWN, zero included
    oldest_report_age: float | None  # seconds since the oldest recorded last report
    reports_stale: int
    not_connected_after_token: int
    revoked: int


def fleet(mappings: Iterable[Mapping], *, now: float) -> Fleet:
    counts: Counter[str] = Counter({name: 0 for name in (*STATES, UNKNOWN)})
    oldest: float | None = None
    stale = stuck = revoked = 0
    for mapping in mappings:
        record = mapping.connection
        # A state nobody reports (an edited status) is no label of its own: bounded cardinality.
        counts[record.state if record is not None and record.state in STATES else UNKNOWN] += 1
        if record is not None and record.last_report_at is not None:
            age = max(0.0, now - record.last_report_at)
            oldest = age if oldest is None else max(oldest, age)
        conditions = (mapping.raw.get("status") or {}).get("conditions") or []
        for cond in conditions:
            if not isinstance(cond, dict):
                continue
            if cond.get("type") == REPORTS_STALE and cond.get("status") == "True":
                stale += 1
            elif cond.get("type") == CONNECTED and cond.get("reason") == NOT_CONNECTED_AFTER_TOKEN:
                stuck += 1
        if mapping.revoked is not None:
            revoked += 1
    return Fleet(dict(counts), oldest, stale, stuck, revoked)
