"""`decide.plan`: every rule, table-driven, on plain data with a fixed clock."""

# ruff: noqa: E501 - one table row per line reads better than wrapped rows

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from agent import decide
from agent.cluster_objects import Connection, TokenRecord, format_time
from agent.decide import (
    Action,
    Observed,
    Plan,
    Reason,
    Refusal,
    Revocation,
    Rules,
    plan,
    reporting_allowed,
    revocation_after,
)
from agent.outcomes import Issued, Refused, Temporary
from agent.retry_policy import RetryPolicy

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
RULES = Rules(
    handover_grace=5 * MIN,
    connection_grace=10 * MIN,
    refusal_cadence=10 * MIN,
    delete_secret_on_disable=True,
    spacing=RetryPolicy(base=2.0, factor=2.0, cap=60.0),
)


def token(
    *, issued: timedelta | None, expires: timedelta | None, managed: bool = True
) -> TokenRecord:
    """A secret's record; `issued`/`expires` are offsets from NOW (negative: in the past)."""
    return TokenRecord(
        managed=managed,
        issued_at=None if issued is None else NOW + issued,
        expires_at=None if expires is None else NOW + expires,
        compass_runtime_id="c-1",
    )


FRESH = token(issued=-1 * MIN, expires=59 * MIN)
OLD_VALID = token(issued=-20 * MIN, expires=40 * MIN)
EXPIRED = token(issued=-70 * MIN, expires=-10 * MIN)
FOREIGN = token(issued=None, expires=None, managed=False)


def conn(state: str | None) -> Connection:
    return Connection(state=state, error=None)


LAST_SYNC = "2025-01-01T11:59:50Z"  # the runtime agent's last attempt, 10 s before NOW
HANDED = "2025-01-01T11:59:00.000Z"  # RECORDED's issue time, as the hand-over annotation says
# A token written 1 min ago while the connection's lastSync was LAST_SYNC.
RECORDED = replace(FRESH, connection_seen=LAST_SYNC)


def failed(
    last_sync: str = LAST_SYNC, handed_over: str | None = None, error: str | None = None
) -> Connection:
    return Connection(
        state="ConnectionFailed", error=error, last_sync_text=last_sync, handed_over=handed_over
    )


def revoked(*, recheck: timedelta) -> Revocation:
    return Revocation(detail="stolen node", since=NOW - 30 * MIN, recheck_at=NOW + recheck)


def obs(**changes: object) -> Observed:
    base = Observed(
        now=NOW,
        module_enabled=True,
        runtime_id="rt-1",
        secret=None,
        connection=None,
        fingerprint="fp-1",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


CASES: list[tuple[str, Observed, Plan]] = [
    # 0. Kyma being deleted: lifecycle-manager removes our RBAC meanwhile; touch nothing
    ("kyma deleting, our secret, module off: keep it", obs(kyma_deleting=True, module_enabled=False, secret=FRESH),
     Plan(Action.IDLE, Reason.KYMA_DELETING)),
    ("kyma deleting, no secret, module on: no pull", obs(kyma_deleting=True),
     Plan(Action.IDLE, Reason.KYMA_DELETING)),
    # 1. module disabled
    ("disabled, our secret: delete", obs(module_enabled=False, secret=FRESH),
     Plan(Action.DELETE_SECRET, Reason.MODULE_DISABLED)),
    ("disabled, foreign secret: leave it", obs(module_enabled=False, secret=FOREIGN),
     Plan(Action.IDLE, Reason.MODULE_DISABLED)),
    ("disabled, no secret: idle", obs(module_enabled=False),
     Plan(Action.IDLE, Reason.MODULE_DISABLED)),
    ("disabled wins over failed connection", obs(module_enabled=False, secret=EXPIRED, connection=conn("ConnectionFailed")),
     Plan(Action.DELETE_SECRET, Reason.MODULE_DISABLED)),
    # 2. runtime id
    ("no runtime id: idle", obs(runtime_id=None),
     Plan(Action.IDLE, Reason.NO_RUNTIME_ID)),
    ("no broker URL: idle, no pull", obs(broker_known=False),
     Plan(Action.IDLE, Reason.NO_BROKER_URL)),
    ("no broker URL, module off: the secret still goes", obs(broker_known=False, module_enabled=False, secret=FRESH),
     Plan(Action.DELETE_SECRET, Reason.MODULE_DISABLED)),
    # 4. no secret
    ("enabled, no secret: pull", obs(),
     Plan(Action.PULL, Reason.NO_SECRET)),
    ("no secret, stale Connected: still pull", obs(connection=conn("Connected")),
     Plan(Action.PULL, Reason.NO_SECRET)),
    # 5. healthy
    ("connected: idle (restart asks for nothing)", obs(secret=EXPIRED, connection=conn("Connected")),
     Plan(Action.IDLE, Reason.CONNECTION_HEALTHY)),
    ("synchronized: idle", obs(secret=OLD_VALID, connection=conn("Synchronized")),
     Plan(Action.IDLE, Reason.CONNECTION_HEALTHY)),
    ("foreign secret, connected: idle", obs(secret=FOREIGN, connection=conn("Synchronized")),
     Plan(Action.IDLE, Reason.CONNECTION_HEALTHY)),
    # 6. ConnectionFailed
    ("failed + expired token: pull", obs(secret=EXPIRED, connection=conn("ConnectionFailed")),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)),
    ("failed + handed over long ago: pull", obs(secret=OLD_VALID, connection=conn("ConnectionFailed")),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)),
    ("failed + foreign secret without record: pull", obs(secret=FOREIGN, connection=conn("ConnectionFailed")),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)),
    ("failed + fresh token: wait for the handover grace", obs(secret=FRESH, connection=conn("ConnectionFailed")),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_FRESH, NOW + 4 * MIN)),
    ("failed + fresh token expiring first: wait until expiry",
     obs(secret=token(issued=-1 * MIN, expires=2 * MIN), connection=conn("ConnectionFailed")),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_FRESH, NOW + 2 * MIN)),
    ("failed at exactly the grace boundary: pull",
     obs(secret=token(issued=-5 * MIN, expires=55 * MIN), connection=conn("ConnectionFailed")),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)),
    # 6. ConnectionFailed, with the lastSync recorded when the token was written: one token per try
    ("failed, token untried, runtime agent tried 10 s ago: wait for its minimal sync time", obs(secret=RECORDED, connection=failed()),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, NOW + 6 * timedelta(seconds=1))),
    ("failed, token untried, minimal sync time over: nudge", obs(now=NOW + 6 * timedelta(seconds=1), secret=RECORDED, connection=failed()),
     Plan(Action.NUDGE, Reason.CONNECTION_FAILED_TOKEN_UNTRIED)),
    ("failed, token untried, no lastSync at all: nudge at once", obs(secret=replace(FRESH, connection_seen=""), connection=failed(last_sync="")),
     Plan(Action.NUDGE, Reason.CONNECTION_FAILED_TOKEN_UNTRIED)),
    ("failed, token untried and handed over: wait until it expires, never replace it", obs(now=NOW + 4 * MIN, secret=RECORDED, connection=failed(handed_over=HANDED)),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, NOW + 59 * MIN)),
    ("failed, untried long past the handover grace: still not replaced", obs(now=NOW + 30 * MIN, secret=RECORDED, connection=failed(handed_over=HANDED)),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, NOW + 59 * MIN)),
    ("failed, an older hand-over on the connection: nudge for this token", obs(now=NOW + MIN, secret=RECORDED, connection=failed(handed_over="2025-01-01T10:00:00.000Z")),
     Plan(Action.NUDGE, Reason.CONNECTION_FAILED_TOKEN_UNTRIED)),
    ("failed, lastSync moved since the write: tried, pull", obs(secret=RECORDED, connection=failed(last_sync="2025-01-01T11:59:58Z", handed_over=HANDED)),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_TRIED)),
    ("failed, a first lastSync after a write without one: tried, pull", obs(secret=replace(FRESH, connection_seen=""), connection=failed()),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_TRIED)),
    ("failed, untried but expired: pull", obs(secret=replace(EXPIRED, connection_seen=LAST_SYNC), connection=failed()),
     Plan(Action.PULL, Reason.CONNECTION_FAILED_TOKEN_STALE)),
    ("failed, untried, expiring before the minimal sync time: wait until expiry", obs(secret=replace(RECORDED, expires_at=NOW + timedelta(seconds=3)), connection=failed()),
     Plan(Action.WAIT, Reason.CONNECTION_FAILED_TOKEN_UNTRIED, NOW + timedelta(seconds=3))),
    # 7. other failures
    ("synchronization failed: idle", obs(secret=EXPIRED, connection=conn("SynchronizationFailed")),
     Plan(Action.IDLE, Reason.CONNECTION_OTHER_FAILURE)),
    ("maintenance failed: idle", obs(secret=EXPIRED, connection=conn("ConnectionMaintenanceFailed")),
     Plan(Action.IDLE, Reason.CONNECTION_OTHER_FAILURE)),
    # 8. no CompassConnection
    ("no connection, grace over, expired: pull", obs(secret=EXPIRED),
     Plan(Action.PULL, Reason.NO_CONNECTION_TOKEN_EXPIRED)),
    ("no connection, grace over, still valid: wait until expiry", obs(secret=OLD_VALID),
     Plan(Action.WAIT, Reason.WAITING_FOR_CONNECTION, NOW + 40 * MIN)),
    ("no connection, expired but grace running: wait for grace",
     obs(secret=token(issued=-3 * MIN, expires=-1 * MIN)),
     Plan(Action.WAIT, Reason.WAITING_FOR_CONNECTION, NOW + 7 * MIN)),
    ("no connection, fresh: wait for the later of both", obs(secret=FRESH),
     Plan(Action.WAIT, Reason.WAITING_FOR_CONNECTION, NOW + 59 * MIN)),
    ("connection without state counts as none", obs(secret=EXPIRED, connection=conn(None)),
     Plan(Action.PULL, Reason.NO_CONNECTION_TOKEN_EXPIRED)),
    ("no connection, foreign secret: pull", obs(secret=FOREIGN),
     Plan(Action.PULL, Reason.NO_CONNECTION_TOKEN_EXPIRED)),
    # 3. refusals
    ("refused recently, nothing changed: wait for the cadence",
     obs(last_refusal=Refusal(403, "forbidden", NOW - 3 * MIN, "fp-1")),
     Plan(Action.WAIT, Reason.REFUSED_RECENTLY, NOW + 7 * MIN)),
    ("refused recently, watched inputs changed: pull",
     obs(last_refusal=Refusal(403, "forbidden", NOW - 3 * MIN, "fp-0")),
     Plan(Action.PULL, Reason.NO_SECRET)),
    ("refused long ago: pull again on the slow cadence",
     obs(last_refusal=Refusal(404, "not-found", NOW - 10 * MIN, "fp-1")),
     Plan(Action.PULL, Reason.NO_SECRET)),
    ("refusal does not block non-pull plans",
     obs(secret=FRESH, connection=conn("Connected"), last_refusal=Refusal(403, "x", NOW, "fp-1")),
     Plan(Action.IDLE, Reason.CONNECTION_HEALTHY)),
    # 3b. spacing between successful pulls
    ("pulled 1 s ago (streak 1): wait out 2 s", obs(last_pull_at=NOW - timedelta(seconds=1), pull_streak=1),
     Plan(Action.WAIT, Reason.PULL_SPACING, NOW + timedelta(seconds=1))),
    ("pulled often (streak 4): spacing grows to 16 s",
     obs(last_pull_at=NOW - timedelta(seconds=10), pull_streak=4),
     Plan(Action.WAIT, Reason.PULL_SPACING, NOW + timedelta(seconds=6))),
    ("spacing over: pull", obs(last_pull_at=NOW - timedelta(seconds=3), pull_streak=1),
     Plan(Action.PULL, Reason.NO_SECRET)),
    ("streak reset: no spacing", obs(last_pull_at=NOW, pull_streak=0),
     Plan(Action.PULL, Reason.NO_SECRET)),
    # 2a. revoked in the control plane: only the slow re-check, whatever else is observed
    ("revoked, re-check due: one token request", obs(revocation=revoked(recheck=-1 * MIN)),
     Plan(Action.RECHECK, Reason.RUNTIME_REVOKED)),
    ("revoked, re-check due exactly now", obs(revocation=revoked(recheck=0 * MIN)),
     Plan(Action.RECHECK, Reason.RUNTIME_REVOKED)),
    ("revoked, re-check later: wait for it", obs(revocation=revoked(recheck=3 * MIN)),
     Plan(Action.WAIT, Reason.RUNTIME_REVOKED, NOW + 3 * MIN)),
    ("revoked, connection failed + expired token: no pull", obs(revocation=revoked(recheck=3 * MIN), secret=EXPIRED, connection=conn("ConnectionFailed")),
     Plan(Action.WAIT, Reason.RUNTIME_REVOKED, NOW + 3 * MIN)),
    ("revoked, connected: the re-check is still the token request", obs(revocation=revoked(recheck=-1 * MIN), secret=FRESH, connection=conn("Connected")),
     Plan(Action.RECHECK, Reason.RUNTIME_REVOKED)),
    ("revoked wins over a refusal and a changed fingerprint", obs(revocation=revoked(recheck=3 * MIN), last_refusal=Refusal(403, "x", NOW, "fp-0")),
     Plan(Action.WAIT, Reason.RUNTIME_REVOKED, NOW + 3 * MIN)),
    ("revoked, module disabled: our secret goes (the module rule, not the revocation)", obs(revocation=revoked(recheck=3 * MIN), module_enabled=False, secret=FRESH),
     Plan(Action.DELETE_SECRET, Reason.MODULE_DISABLED)),
    ("revoked, kyma deleting: idle", obs(revocation=revoked(recheck=-1 * MIN), kyma_deleting=True),
     Plan(Action.IDLE, Reason.KYMA_DELETING)),
    ("revoked, broker URL gone: idle", obs(revocation=revoked(recheck=-1 * MIN), broker_known=False),
     Plan(Action.IDLE, Reason.NO_BROKER_URL)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("observed", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_plan(observed: Observed, expected: Plan) -> None:
    assert plan(observed, RULES) == expected


def test_policy_keeps_secret_when_told() -> None:
    rules = replace(RULES, delete_secret_on_disable=False)
    assert plan(obs(module_enabled=False, secret=FRESH), rules) == Plan(
        Action.IDLE, Reason.MODULE_DISABLED_SECRET_KEPT
    )


def test_every_reason_is_reachable() -> None:
    """Each reason comes out of `plan` itself for some observed state, not out of the table."""
    keep = replace(RULES, delete_secret_on_disable=False)
    reached = {plan(observed, RULES).reason for _, observed, _ in CASES}
    reached.add(plan(obs(module_enabled=False, secret=FRESH), keep).reason)
    assert reached == set(Reason)


def test_wait_is_always_in_the_future() -> None:
    waits = [(plan(observed, RULES), observed) for _, observed, _ in CASES]
    waits = [(result, observed) for result, observed in waits if result.action is Action.WAIT]
    assert len(waits) >= 3  # the table does cover waiting
    for result, observed in waits:
        assert result.until is not None
        assert result.until > observed.now


# -- revocation transitions and when reports go -------------------------------------------------

REVOKED_403 = Refused(403, "https://broker.test/problems/runtime-revoked", "stolen node")
TOKEN = Issued(
    token="ott",
    connector_url="https://c",
    compass_runtime_id="c-1",
    tenant="t",
    expires_at=NOW + 60 * MIN,
    issued_at=NOW,
)
RECHECK = 10 * MIN


def test_a_runtime_revoked_answer_starts_the_slow_recheck() -> None:
    after = revocation_after(None, REVOKED_403, now=NOW, recheck_after=RECHECK)
    assert after == Revocation(detail="stolen node", since=NOW, recheck_at=NOW + RECHECK)


def test_still_revoked_keeps_since_and_moves_the_recheck() -> None:
    current = revoked(recheck=-1 * MIN)
    again = replace(REVOKED_403, detail="still stolen")
    after = revocation_after(current, again, now=NOW, recheck_after=RECHECK)
    assert after == Revocation(detail="still stolen", since=current.since, recheck_at=NOW + RECHECK)


@pytest.mark.parametrize(
    "outcome",
    [TOKEN, Refused(409, "urn:module-not-enabled"), Refused(403, "urn:sa-not-allowed")],
    ids=["token", "409", "403 of another kind"],
)
def test_a_token_or_another_refusal_ends_the_revocation(outcome: object) -> None:
    current = revoked(recheck=-1 * MIN)
    assert revocation_after(current, outcome, now=NOW, recheck_after=RECHECK) is None  # type: ignore[arg-type]


def test_no_answer_while_revoked_waits_for_the_next_recheck() -> None:
    current = revoked(recheck=-1 * MIN)
    after = revocation_after(
        current, Temporary("transport: ConnectError"), now=NOW, recheck_after=RECHECK
    )
    assert after == replace(current, recheck_at=NOW + RECHECK)


def test_no_answer_while_not_revoked_stays_not_revoked() -> None:
    assert revocation_after(None, Temporary("503", 503), now=NOW, recheck_after=RECHECK) is None


@pytest.mark.parametrize(
    ("kind", "revoked_"),
    [
        ("runtime-revoked", True),
        ("urn:kyma-compass:runtime-revoked", True),
        ("https://broker.test/problems/runtime-revoked", True),
        ("https://broker.test/problems/runtime-revoked/", False),
        ("https://broker.test/problems/runtime-revoked-not", False),
        ("urn:forbidden", False),
    ],
)
def test_revoked_is_a_403_whose_type_ends_in_runtime_revoked(kind: str, revoked_: bool) -> None:
    assert Refused(403, kind).revoked is revoked_
    assert Refused(401, kind).revoked is False
    assert Refused(409, kind).revoked is False


def test_reports_go_only_when_the_broker_would_take_them() -> None:
    allowed = {r for r in Reason if reporting_allowed(Plan(Action.IDLE, r))}
    assert allowed == {
        Reason.PULL_SPACING,
        Reason.NO_SECRET,
        Reason.CONNECTION_HEALTHY,
        Reason.CONNECTION_FAILED_TOKEN_STALE,
        Reason.CONNECTION_FAILED_TOKEN_FRESH,
        Reason.CONNECTION_FAILED_TOKEN_TRIED,
        Reason.CONNECTION_FAILED_TOKEN_UNTRIED,
        Reason.CONNECTION_OTHER_FAILURE,
        Reason.NO_CONNECTION_TOKEN_EXPIRED,
        Reason.WAITING_FOR_CONNECTION,
    }


def test_one_token_per_try_of_a_runtime_agent_that_acts_only_at_its_resync() -> None:
    """A runtime agent that fails every token and tries only every 180 s (or right after a
    hand-over): the plan pulls exactly once per try, never while a token waits untried."""
    rules = replace(RULES, handover_grace=timedelta(seconds=5))
    second = timedelta(seconds=1)
    now, last_sync, pulls, tries, nudged = NOW, "", 0, 0, None
    secret = replace(FRESH, issued_at=NOW, expires_at=NOW + 60 * MIN, connection_seen="")
    next_resync = NOW + 180 * second
    while now < NOW + 30 * MIN:
        connection = failed(last_sync=last_sync, handed_over=nudged)
        decided = plan(obs(now=now, secret=secret, connection=connection), rules)
        if decided.action is Action.PULL:
            pulls += 1
            secret = replace(secret, issued_at=now, connection_seen=last_sync)
        elif decided.action is Action.NUDGE:
            nudged = format_time(secret.issued_at)  # type: ignore[arg-type]
            next_resync = now  # any update of its CompassConnection makes it reconcile
        if now >= next_resync:
            tries += 1
            last_sync = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            next_resync = now + 180 * second
        now += second
    assert tries > 10
    assert pulls in (tries, tries - 1)  # the last try's token may still be on its way


# --- what /readyz says -------------------------------------------------------------------------

ENROLMENT_PENDING = decide.ReportRefusal(
    403,
    "urn:kyma-compass-pull:broker:problem:enrolment-pending",
    "the issuer awaits approval",
)


def test_a_healthy_connection_whose_reports_are_refused_is_not_said_to_be_healthy() -> None:
    healthy = decide.Plan(decide.Action.IDLE, decide.Reason.CONNECTION_HEALTHY)
    assert decide.readiness_reason(healthy, revocation=None, report_refusal=None) == (
        "connection-healthy"
    )
    assert decide.readiness_reason(healthy, revocation=None, report_refusal=ENROLMENT_PENDING) == (
        "reports-refused: 403 enrolment-pending: the issuer awaits approval"
    )


def test_revocation_and_plans_without_reports_speak_for_themselves() -> None:
    revoked = decide.Plan(decide.Action.WAIT, decide.Reason.RUNTIME_REVOKED)
    revocation = decide.Revocation(detail="x" * 600, since=NOW, recheck_at=NOW)
    said = decide.readiness_reason(revoked, revocation=revocation, report_refusal=ENROLMENT_PENDING)
    assert said == "runtime-revoked: " + "x" * decide.DETAIL_CHARS
    # The module is off: no reports are sent, an old refusal says nothing about now.
    off = decide.Plan(decide.Action.IDLE, decide.Reason.MODULE_DISABLED)
    assert decide.readiness_reason(off, revocation=None, report_refusal=ENROLMENT_PENDING) == (
        "module-disabled"
    )
