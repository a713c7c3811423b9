"""The agent's one decision: from what it observed, what single thing to do now.

`plan(observed, rules)` is pure (the clock is `observed.now`), total (every input yields one
plan) and ordered — the first rule that applies wins:

0. Kyma being deleted     → IDLE, the secret left alone: lifecycle-manager is removing every
                            module and, at the same time, this agent's own RBAC; the broker
                            unregisters the runtime, which makes the token worthless anyway
1. module disabled        → DELETE_SECRET if our secret is there and policy says so, else IDLE
2. runtime ID unknown     → IDLE (a watch event brings it); broker URL unknown → IDLE
2a. runtime revoked in the control plane (a 403 `runtime-revoked` to a token request or a
   report) → RECHECK (ONE token request) when the jittered re-check time has come, else WAIT
   until then; nothing else — no pull, no report, and the secret is left as it is
3. a pull would be next, but the broker refused (401/403/404/409) recently and nothing
   watched changed since   → WAIT until the refusal cadence is over; or tokens were pulled
   in a row without the connection becoming healthy → WAIT out a growing spacing (so a
   secret that keeps vanishing cannot make a hot loop)
4. no secret              → PULL (the runtime agent only runs while the secret exists, so a
   CompassConnection without a secret says nothing about the present)
5. connection healthy     → IDLE (a restarted agent asks for nothing)
6. ConnectionFailed       → PULL when the token expired, or compass-runtime-agent has tried
                            it (the CompassConnection's lastSync differs from the one recorded
                            when the token was written); an untried token is never replaced:
                            NUDGE (an annotation on the CompassConnection, on which the runtime
                            agent reconciles at once) once its minimal sync time has passed
                            since its last attempt, then WAIT. A secret without that record
                            falls back to the handover grace
7. other failed states    → IDLE (they come after a certificate was issued; a token won't help)
8. no CompassConnection   → PULL when the token expired and the connection grace since it was
                            written is over; else WAIT until both are true
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from agent.cluster_objects import Connection, TokenRecord, format_time
from agent.outcomes import Issued, Outcome, Refused
from agent.retry_policy import DEFAULT_POLICY, RetryPolicy, step


class Action(StrEnum):
    PULL = "pull"
    DELETE_SECRET = "delete-secret"  # noqa: S105 - a name, not a password
    IDLE = "idle"
    WAIT = "wait"
    RECHECK = "recheck-revocation"  # one token request, no retries: is the runtime still revoked?
    NUDGE = "nudge-runtime-agent"  # annotate the CompassConnection: try the token now


class Reason(StrEnum):
    KYMA_DELETING = "kyma-deleting"
    NO_BROKER_URL = "no-broker-url"
    MODULE_DISABLED = "module-disabled"
    MODULE_DISABLED_SECRET_KEPT = "module-disabled-secret-kept"  # noqa: S105 - a name, not a password
    NO_RUNTIME_ID = "no-runtime-id"
    RUNTIME_REVOKED = "runtime-revoked"
    REFUSED_RECENTLY = "refused-recently"
    PULL_SPACING = "pull-spacing"
    NO_SECRET = "no-secret"  # noqa: S105 - a name, not a password
    CONNECTION_HEALTHY = "connection-healthy"
    CONNECTION_FAILED_TOKEN_STALE = "connection-failed-token-stale"  # noqa: S105 - a name, not a password
    CONNECTION_FAILED_TOKEN_FRESH = "connection-failed-token-fresh"  # noqa: S105 - a name, not a password
    CONNECTION_FAILED_TOKEN_TRIED = "connection-failed-token-tried"  # noqa: S105 - a name, not a password
    CONNECTION_FAILED_TOKEN_UNTRIED = "connection-failed-token-untried"  # noqa: S105 - a name, not a password
    CONNECTION_OTHER_FAILURE = "connection-other-failure"
    NO_CONNECTION_TOKEN_EXPIRED = "no-connection-token-expired"  # noqa: S105 - a name, not a password
    WAITING_FOR_CONNECTION = "waiting-for-connection"


@dataclass(frozen=True)
class Refusal:
    """The broker's last permanent answer (401/403/404/409), remembered in memory."""

    status: int
    reason: str
    at: datetime
    fingerprint: str


@dataclass(frozen=True)
class Revocation:
    """The control plane said this runtime is revoked; remembered in memory (a restarted agent
    learns it again from its first request)."""

    detail: str  # the operator's reason, as the broker gave it
    since: datetime
    recheck_at: datetime  # jittered when the 403 arrived, so the plan stays pure


@dataclass(frozen=True)
class Observed:
    now: datetime
    module_enabled: bool
    runtime_id: str | None
    secret: TokenRecord | None
    connection: Connection | None
    fingerprint: str
    kyma_deleting: bool = False
    broker_known: bool = True
    last_refusal: Refusal | None = None
    last_pull_at: datetime | None = None  # last token received
    pull_streak: int = 0  # tokens received since the connection was last healthy
    revocation: Revocation | None = None


@dataclass(frozen=True)
class Rules:
    handover_grace: timedelta
    connection_grace: timedelta
    refusal_cadence: timedelta
    delete_secret_on_disable: bool = True
    spacing: RetryPolicy = DEFAULT_POLICY
    # compass-runtime-agent ignores a reconcile sooner than this after its last attempt
    # (APP_MINIMAL_COMPASS_SYNC_TIME, 15 s in the module), plus a second: lastSync has seconds only.
    runtime_agent_min_sync: timedelta = timedelta(seconds=16)


@dataclass(frozen=True)
class Plan:
    action: Action
    reason: Reason
    until: datetime | None = None  # only for WAIT


def plan(observed: Observed, rules: Rules) -> Plan:  # noqa: PLR0911 - the ordered rules
    if observed.kyma_deleting:
        return Plan(Action.IDLE, Reason.KYMA_DELETING)
    if not observed.module_enabled:
        if observed.secret is not None and observed.secret.managed:
            if rules.delete_secret_on_disable:
                return Plan(Action.DELETE_SECRET, Reason.MODULE_DISABLED)
            return Plan(Action.IDLE, Reason.MODULE_DISABLED_SECRET_KEPT)
        return Plan(Action.IDLE, Reason.MODULE_DISABLED)
    if observed.runtime_id is None:
        return Plan(Action.IDLE, Reason.NO_RUNTIME_ID)
    if not observed.broker_known:
        return Plan(Action.IDLE, Reason.NO_BROKER_URL)
    if observed.revocation is not None:
        recheck_at = observed.revocation.recheck_at
        if recheck_at <= observed.now:
            return Plan(Action.RECHECK, Reason.RUNTIME_REVOKED)
        return Plan(Action.WAIT, Reason.RUNTIME_REVOKED, recheck_at)
    wanted = _token_plan(observed, rules)
    if wanted.action is Action.PULL:
        return _respect_refusal(observed, rules) or _respect_spacing(observed, rules) or wanted
    return wanted


def _token_plan(observed: Observed, rules: Rules) -> Plan:  # noqa: PLR0911 - a decision table
    secret, connection, now = observed.secret, observed.connection, observed.now
    if secret is None:
        return Plan(Action.PULL, Reason.NO_SECRET)
    if connection is not None and connection.healthy:
        return Plan(Action.IDLE, Reason.CONNECTION_HEALTHY)
    if connection is not None and connection.failed:
        if secret.expired(now) or secret.issued_at is None:
            return Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)
        if secret.connection_seen is not None:
            return _failed_with_recorded_token(secret, connection, now, rules)
        handed_over_until = secret.issued_at + rules.handover_grace
        if handed_over_until <= now:
            return Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)
        assert secret.expires_at is not None  # not expired implies known
        until = min(handed_over_until, secret.expires_at)
        return Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_FRESH, until)
    if connection is not None and connection.state is not None:
        return Plan(Action.IDLE, Reason.CONNECTION_OTHER_FAILURE)
    # No CompassConnection (or one without a state yet): the runtime agent has not reported.
    grace_over_at = None if secret.issued_at is None else secret.issued_at + rules.connection_grace
    grace_over = grace_over_at is None or grace_over_at <= now
    if grace_over and secret.expired(now):
        return Plan(Action.PULL, Reason.NO_CONNECTION_TOKEN_EXPIRED)
    candidates = [t for t in (grace_over_at, secret.expires_at) if t is not None and t > now]
    return Plan(Action.WAIT, Reason.WAITING_FOR_CONNECTION, max(candidates))


def handed_over_value(secret: TokenRecord) -> str | None:
    """What the agent writes into the CompassConnection's annotation for this token."""
    return None if secret.issued_at is None else format_time(secret.issued_at)


def _failed_with_recorded_token(
    secret: TokenRecord, connection: Connection, now: datetime, rules: Rules
) -> Plan:
    """ConnectionFailed with a token whose hand-over the secret recorded: one token per try."""
    assert secret.expires_at is not None  # not expired implies known
    if connection.last_sync_text != secret.connection_seen:
        return Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_TRIED)
    if connection.handed_over == handed_over_value(secret):
        # Asked already; its next attempt (at the latest its resync) changes lastSync.
        return Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, secret.expires_at)
    last_attempt = connection.last_sync
    nudge_at = now if last_attempt is None else last_attempt + rules.runtime_agent_min_sync
    if nudge_at <= now:
        return Plan(Action.NUDGE, Reason.CONNECTION_FAILED_TOKEN_UNTRIED)
    return Plan(
        Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, min(nudge_at, secret.expires_at)
    )


def _respect_refusal(observed: Observed, rules: Rules) -> Plan | None:
    refusal = observed.last_refusal
    if refusal is None or refusal.fingerprint != observed.fingerprint:
        return None
    again_at = refusal.at + rules.refusal_cadence
    if again_at <= observed.now:
        return None
    return Plan(Action.WAIT, Reason.REFUSED_RECENTLY, again_at)


def _respect_spacing(observed: Observed, rules: Rules) -> Plan | None:
    if observed.last_pull_at is None or observed.pull_streak < 1:
        return None
    again_at = observed.last_pull_at + timedelta(seconds=step(rules.spacing, observed.pull_streak))
    if again_at <= observed.now:
        return None
    return Plan(Action.WAIT, Reason.PULL_SPACING, again_at)


# Plans under which connection reports are not sent: the broker would refuse them (or has, for
# the token), there is nobody to send them to, or the runtime is going away.
_NO_REPORTS = frozenset(
    {
        Reason.KYMA_DELETING,
        Reason.MODULE_DISABLED,
        Reason.MODULE_DISABLED_SECRET_KEPT,
        Reason.NO_RUNTIME_ID,
        Reason.NO_BROKER_URL,
        Reason.RUNTIME_REVOKED,
        Reason.REFUSED_RECENTLY,
    }
)


def reporting_allowed(plan: Plan) -> bool:
    return plan.reason not in _NO_REPORTS


# How much of the control plane's words (a revocation's reason, a refusal's detail) is repeated.
DETAIL_CHARS = 512


@dataclass(frozen=True)
class ReportRefusal:
    """The broker's permanent answer (a 4xx other than 429 and `runtime-revoked`) to the last
    connection report, remembered in memory until a report is accepted."""

    status: int
    reason: str  # the problem `type` (or title)
    detail: str = ""


def problem_slug(reason: str) -> str:
    """`urn:kyma-compass-pull:broker:problem:enrolment-pending` → `enrolment-pending`."""
    return reason.rsplit(":", 1)[-1]


def readiness_reason(
    plan: Plan, *, revocation: Revocation | None, report_refusal: ReportRefusal | None
) -> str:
    """What `/readyz` says after `ready:`: the plan's reason, unless the control plane refuses
    this runtime's word. A plan of `connection-healthy` speaks for the runtime's Compass
    connection only; while the broker refuses its reports (e.g. 403 `enrolment-pending` after
    a BYOC issuer changed), the control plane does not see that connection, and the module
    state must say so instead of "healthy"."""
    if plan.reason is Reason.RUNTIME_REVOKED and revocation is not None:
        return f"{plan.reason}: {revocation.detail[:DETAIL_CHARS]}"
    if report_refusal is not None and plan.reason not in _NO_REPORTS:
        said = f"reports-refused: {report_refusal.status} {problem_slug(report_refusal.reason)}"
        detail = report_refusal.detail[:DETAIL_CHARS]
        return said + (f": {detail}" if detail else "")
    return str(plan.reason)


def revocation_after(
    current: Revocation | None, outcome: Outcome, *, now: datetime, recheck_after: timedelta
) -> Revocation | None:
    """The revocation state after the broker's answer to a token request (or a report's 403
    `runtime-revoked`): a `runtime-revoked` refusal (re)starts the slow re-check; a token or
    any other refusal ends it (the broker judged the runtime and did not say revoked); no answer
    (`Temporary`) proves nothing either way, so a revoked runtime waits for the next re-check.
    """
    if isinstance(outcome, Refused) and outcome.revoked:
        since = current.since if current is not None else now
        return Revocation(detail=outcome.detail, since=since, recheck_at=now + recheck_after)
    if isinstance(outcome, Issued | Refused) or current is None:
        return None
    return replace(current, recheck_at=now + recheck_after)
