"""Connection reports and the fleet's connection health, decided without network: what is
written for a report, when nothing is written, and how stale and stuck runtimes are judged."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from control_plane_broker.connections import report_rules
from control_plane_broker.connections.report_rules import (
    Change,
    Limits,
    Report,
    check,
    fleet,
    record_report,
)
from control_plane_broker.registration import state
from control_plane_broker.registration.state import Mapping
from control_plane_broker.text import for_humans
from tests.conftest import REPO_ROOT

LIMITS = Limits(refresh_seconds=3600, stale_seconds=7200, connect_deadline_seconds=900)
T0 = 1_800_000_000.0  # 2027-01-15
SHA = "a" * 64


def mapping(status: dict[str, Any] | None = None, **annotations: str) -> Mapping:
    return Mapping.from_object(
        {
            "metadata": {
                "name": "rt-1",
                "resourceVersion": "5",
                "generation": 2,
                "annotations": annotations,
            },
            "status": status or {},
        }
    )


def applied(before: Mapping, change: Change | None) -> Mapping:
    """The mapping after a merge patch of `change` (nulls remove keys), as the server does."""
    assert change is not None
    status = dict(before.raw.get("status") or {})
    for key, value in change.status.items():
        if key == "connection":
            merged = dict(status.get("connection") or {})
            merged.update(value)
            status["connection"] = {k: v for k, v in merged.items() if v is not None}
        else:
            status[key] = value
    raw = dict(before.raw)
    raw["status"] = status
    return Mapping.from_object(raw)


def report(state_: str = "Connected", at: float = T0, **kw: Any) -> Report:
    return Report(state=state_, observed_at=at, **kw)


def cond(m: Mapping, type_: str) -> dict[str, Any] | None:
    return state.find_condition(state.conditions_of(m), type_)


@pytest.mark.parametrize(
    ("state_", "connected"),
    [
        ("Connected", True),
        ("Synchronized", True),
        ("SynchronizationFailed", True),
        ("ResourceApplicationFailed", True),
        ("MetadataUpdateFailed", True),
        ("ConnectionFailed", False),
        ("ConnectionMaintenanceFailed", False),
        ("NotFound", False),
    ],
)
def test_which_states_count_as_connected(state_: str, connected: bool) -> None:
    assert report_rules.is_connected(state_) is connected
    assert state_ in report_rules.STATES


def test_a_first_report_records_everything_and_the_connected_condition() -> None:
    m = mapping()
    change = record_report(
        m,
        report(certificate_not_after="2027-06-01T00:00:00Z", token_sha256=SHA),
        now=T0 + 2,
        limits=LIMITS,
    )
    after = applied(m, change)
    assert change is not None
    assert change.events == ()
    assert change.status["connection"] == {
        "state": "Connected",
        "connected": True,
        "certificateNotAfter": "2027-06-01T00:00:00Z",
        "lastError": None,
        "tokenSha256": SHA,
        "observedAt": state.to_rfc3339(T0),
        "lastReportAt": state.to_rfc3339(T0 + 2),
        "lastConnectedAt": state.to_rfc3339(T0 + 2),
    }
    assert cond(after, "Connected") == {
        "type": "Connected",
        "status": "True",
        "reason": "Connected",
        "message": "the runtime reports Connected",
        "lastTransitionTime": state.to_rfc3339(T0 + 2),
        "observedGeneration": 2,
    }
    assert cond(after, "ReportsStale") is None


def test_the_same_report_again_writes_nothing_until_the_refresh_interval() -> None:
    m = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    for later in (60, 600, 3599):
        assert record_report(m, report(at=T0 + later), now=T0 + later, limits=LIMITS) is None
    change = record_report(m, report(at=T0 + 3600), now=T0 + 3600, limits=LIMITS)
    assert change is not None
    assert set(change.status) == {"connection"}  # the condition did not change
    assert change.status["connection"]["lastReportAt"] == state.to_rfc3339(T0 + 3600)


@pytest.mark.parametrize(
    "changed",
    [
        {"state_": "ConnectionFailed"},
        {"last_error": "x509: certificate has expired"},
        {"certificate_not_after": "2028-01-01T00:00:00Z"},
        {"token_sha256": "b" * 64},
    ],
)
def test_any_change_but_the_times_is_written_at_once(changed: dict[str, Any]) -> None:
    m = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    assert record_report(m, report(**changed, at=T0 + 1), now=T0 + 1, limits=LIMITS) is not None


def test_a_failure_sets_connected_false_with_the_state_and_the_error() -> None:
    m = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    failed = applied(
        m,
        record_report(
            m,
            report("ConnectionFailed", at=T0 + 50, last_error="token already used"),
            now=T0 + 60,
            limits=LIMITS,
        ),
    )
    c = cond(failed, "Connected")
    assert c is not None
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "ConnectionFailed",
        "token already used",
    )
    assert c["lastTransitionTime"] == state.to_rfc3339(T0 + 60)
    assert failed.connection is not None
    assert failed.connection.last_connected_at == T0  # kept from the connected report
    # The error cleared: a merge patch with null removes it.
    again = applied(failed, record_report(failed, report(at=T0 + 70), now=T0 + 80, limits=LIMITS))
    assert again.connection is not None
    assert again.connection.last_error is None
    assert "lastError" not in again.raw["status"]["connection"]


def test_an_older_report_never_overwrites_a_newer_one() -> None:
    m = applied(
        mapping(), record_report(mapping(), report(at=T0 + 100), now=T0 + 150, limits=LIMITS)
    )
    late = report("ConnectionFailed", at=T0 + 50)
    assert record_report(m, late, now=T0 + 200, limits=LIMITS) is None


def test_an_observed_time_in_the_future_counts_as_now() -> None:
    m = applied(mapping(), record_report(mapping(), report(at=T0 + 10**6), now=T0, limits=LIMITS))
    assert m.connection is not None
    assert m.connection.observed_at == T0
    # ... so it cannot block the reports that follow it.
    assert record_report(m, report("NotFound", at=T0 + 5), now=T0 + 5, limits=LIMITS) is not None


def test_other_conditions_are_kept() -> None:
    other = {"type": "TokenIssued", "status": "True", "reason": "TokenIssued", "message": "m"}
    m = mapping({"conditions": [other]})
    after = applied(m, record_report(m, report(), now=T0, limits=LIMITS))
    assert state.conditions_of(after)[0] == other


# --- stale and stuck ---------------------------------------------------------------------------


def test_reports_go_stale_once_with_an_event_and_recover_with_the_next_report() -> None:
    m = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    assert check(m, now=T0 + 7199, limits=LIMITS) is None
    change = check(m, now=T0 + 7200, limits=LIMITS)
    assert change is not None
    assert set(change.status) == {"conditions"}
    [tell] = change.events
    assert tell.reason == "ConnectionReportsStale"
    stale = applied(m, change)
    c = cond(stale, "ReportsStale")
    assert c is not None
    assert (c["status"], c["reason"]) == ("True", "NoRecentReport")
    # Judged again later: the same condition, nothing written, nobody told twice.
    assert check(stale, now=T0 + 90_000, limits=LIMITS) is None
    back = applied(stale, record_report(stale, report(at=T0 + 8000), now=T0 + 8000, limits=LIMITS))
    c = cond(back, "ReportsStale")
    assert c is not None
    assert (c["status"], c["reason"]) == ("False", "ReportsReceived")
    assert check(back, now=T0 + 8001, limits=LIMITS) is None


def test_a_runtime_that_never_reported_is_not_stale() -> None:
    assert check(mapping(), now=T0 + 10**6, limits=LIMITS) is None


def token_at(ts: float) -> Mapping:
    return mapping({"lastTokenIssuedAt": state.to_rfc3339(ts)})


def test_a_token_without_a_connected_report_within_the_deadline_is_flagged_once() -> None:
    m = token_at(T0)
    assert check(m, now=T0 + 899, limits=LIMITS) is None
    change = check(m, now=T0 + 900, limits=LIMITS)
    assert change is not None
    [tell] = change.events
    assert tell.reason == "RuntimeNotConnected"
    stuck = applied(m, change)
    c = cond(stuck, "Connected")
    assert c is not None
    assert (c["status"], c["reason"]) == ("False", "NotConnectedAfterToken")
    assert state.to_rfc3339(T0) in c["message"]
    assert check(stuck, now=T0 + 5000, limits=LIMITS) is None


def test_a_failing_report_after_the_deadline_keeps_the_stuck_reason_without_flapping() -> None:
    stuck = applied(token_at(T0), check(token_at(T0), now=T0 + 900, limits=LIMITS))
    failing = report("ConnectionFailed", at=T0 + 1000, last_error="token expired")
    after = applied(stuck, record_report(stuck, failing, now=T0 + 1000, limits=LIMITS))
    c = cond(after, "Connected")
    assert c is not None
    assert c["reason"] == "NotConnectedAfterToken"
    assert c["message"].endswith("the runtime reports ConnectionFailed: token expired")
    assert check(after, now=T0 + 1100, limits=LIMITS) is None
    # Connected at last: the condition flips, nothing more to tell.
    ok = record_report(after, report(at=T0 + 1200), now=T0 + 1200, limits=LIMITS)
    assert ok is not None
    assert ok.events == ()
    c = cond(applied(after, ok), "Connected")
    assert c is not None
    assert (c["status"], c["reason"]) == ("True", "Connected")


def test_connected_after_the_token_then_failing_is_a_plain_failure() -> None:
    m = token_at(T0)
    m = applied(m, record_report(m, report(at=T0 + 100), now=T0 + 100, limits=LIMITS))
    failed = report("ConnectionFailed", at=T0 + 5000)
    m = applied(m, record_report(m, failed, now=T0 + 5000, limits=LIMITS))
    c = cond(m, "Connected")
    assert c is not None
    assert c["reason"] == "ConnectionFailed"
    assert check(m, now=T0 + 9000, limits=LIMITS) is None


def test_a_new_token_after_a_failure_starts_a_new_deadline() -> None:
    m = mapping(
        {
            "lastTokenIssuedAt": state.to_rfc3339(T0 + 6000),
            "connection": {
                "state": "ConnectionFailed",
                "connected": False,
                "observedAt": state.to_rfc3339(T0 + 5000),
                "lastReportAt": state.to_rfc3339(T0 + 5000),
                "lastConnectedAt": state.to_rfc3339(T0 + 100),
            },
        }
    )
    # Before the new deadline: what the record says, nobody told.
    early = check(m, now=T0 + 6899, limits=LIMITS)
    assert early is not None
    assert early.events == ()
    m = applied(m, early)
    c = cond(m, "Connected")
    assert c is not None
    assert c["reason"] == "ConnectionFailed"
    change = check(m, now=T0 + 6900, limits=LIMITS)
    assert change is not None
    assert [t.reason for t in change.events] == ["RuntimeNotConnected"]


# --- the fleet ---------------------------------------------------------------------------------


def test_the_fleet_counts_every_state_and_the_oldest_report() -> None:
    reported = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    failing = applied(
        mapping(), record_report(mapping(), report("NotFound"), now=T0 + 50, limits=LIMITS)
    )
    stale = applied(reported, check(reported, now=T0 + 8000, limits=LIMITS))
    edited = mapping({"connection": {"state": "Exploded", "connected": True}})
    revoked = mapping(**{state.ANNOTATION_REVOKED: ""})
    view = fleet([reported, failing, stale, edited, revoked, mapping()], now=T0 + 100)
    assert view.by_state["Connected"] == 2
    assert view.by_state["NotFound"] == 1
    assert view.by_state["unknown"] == 3  # no report, twice, and a state nobody reports
    assert view.by_state["Synchronized"] == 0
    assert set(view.by_state) == {*report_rules.STATES, "unknown"}
    assert view.oldest_report_age == 100
    assert (view.reports_stale, view.revoked) == (1, 1)
    assert fleet([], now=T0).oldest_report_age is None


def test_reports_within_one_second_are_ordered_by_their_microseconds() -> None:
    newer = report("ConnectionFailed", at=T0 + 0.75)
    m = applied(mapping(), record_report(mapping(), newer, now=T0 + 1, limits=LIMITS))
    assert m.raw["status"]["connection"]["observedAt"] == "2027-01-15T08:00:00.750000Z"
    older = report("Connected", at=T0 + 0.5)
    assert record_report(m, older, now=T0 + 1, limits=LIMITS) is None


# --- free text from runtimes reaches people without terminal controls ----------------------------

HOSTILE = (
    "dial \x1b[2J\x1b]0;pwned\x07tcp\r\n\u202eexe.txt\u2066x\u2069\u200b\x00\x7f\x9b31m: refused"
)


def _clean(text: str) -> bool:
    return not any(
        ch in text
        for ch in ("\x1b", "\x07", "\r", "\n", "\u202e", "\u2066", "\u2069", "\u200b", "\x00")
    ) and all(ch.isprintable() for ch in text)


def test_a_reports_error_is_stored_and_shown_without_control_or_bidi_characters() -> None:
    after = applied(
        mapping(),
        record_report(
            mapping(), report("ConnectionFailed", last_error=HOSTILE), now=T0, limits=LIMITS
        ),
    )
    stored = after.raw["status"]["connection"]["lastError"]
    assert _clean(stored)
    assert "dial" in stored
    assert "refused" in stored
    assert "exe.txt" in stored
    condition = cond(after, "Connected")
    assert condition is not None
    assert _clean(condition["message"])


def test_an_error_recorded_before_cleaning_is_cleaned_in_the_condition_and_the_event() -> None:
    # A mapping written by an older broker: its stored error is not trusted either.
    old = mapping(
        {
            "connection": {
                "state": "ConnectionFailed",
                "connected": False,
                "lastError": HOSTILE,
                "lastReportAt": state.to_rfc3339(T0),
                "observedAt": state.to_rfc3339(T0),
            },
            "lastTokenIssuedAt": state.to_rfc3339(T0),
        }
    )
    change = check(old, now=T0 + LIMITS.connect_deadline_seconds + 1, limits=LIMITS)
    assert change is not None
    assert change.events
    assert all(_clean(tell.message) for tell in change.events)
    assert all(_clean(c["message"]) for c in change.status["conditions"])


@given(st.text())
def test_text_for_humans_keeps_nothing_a_terminal_acts_on(text: str) -> None:
    out = for_humans(text)
    assert all(ch.isprintable() or ch == " " for ch in out)
    assert not any(unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp", "Cs"} for ch in out)
    assert for_humans(out) == out


def test_a_failed_connection_is_told_once_with_its_error_and_not_for_not_found() -> None:
    m = applied(mapping(), record_report(mapping(), report(), now=T0, limits=LIMITS))
    change = record_report(
        m,
        report("ConnectionFailed", at=T0 + 50, last_error="token already used"),
        now=T0 + 60,
        limits=LIMITS,
    )
    assert change is not None
    assert change.events == (
        report_rules.WarningEvent(
            "RuntimeConnectionFailed", "the runtime reports ConnectionFailed: token already used"
        ),
    )
    failed = applied(m, change)
    again = record_report(
        failed,
        report("ConnectionFailed", at=T0 + 90, last_error="token already used again"),
        now=T0 + 100,
        limits=LIMITS,
    )
    assert again is not None
    assert again.events == ()  # the same failure goes on: the condition's message only
    not_found = record_report(mapping(), report("NotFound"), now=T0, limits=LIMITS)
    assert not_found is not None
    assert not_found.events == ()  # no CompassConnection yet: not a failure to tell


def test_a_revoked_runtime_is_not_connected_until_the_revocation_is_lifted() -> None:
    tokened = mapping({"lastTokenIssuedAt": state.to_rfc3339(T0)})
    connected = applied(tokened, record_report(tokened, report(), now=T0, limits=LIMITS))
    revoked = Mapping.from_object(
        {
            **connected.raw,
            "metadata": {
                **connected.raw["metadata"],
                "annotations": {state.ANNOTATION_REVOKED: "leaked credentials"},
            },
        }
    )
    change = check(revoked, now=T0 + 10, limits=LIMITS)
    assert change is not None
    assert change.events == ()  # the broker tells RuntimeRevoked when it refuses
    after = applied(revoked, change)
    c = cond(after, "Connected")
    assert c is not None
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "Revoked",
        "an operator revoked this runtime: leaked credentials",
    )
    assert check(after, now=T0 + 20, limits=LIMITS) is None  # judged again: nothing to write
    # Past the connect deadline and the stale bound: revoked says more than "not connected",
    # and its refused reports are no news.
    assert check(after, now=T0 + 10 * LIMITS.connect_deadline_seconds, limits=LIMITS) is None
    lifted = Mapping.from_object(
        {**after.raw, "metadata": {**after.raw["metadata"], "annotations": {}}}
    )
    back = applied(lifted, check(lifted, now=T0 + 30, limits=LIMITS))
    c = cond(back, "Connected")
    assert c is not None
    assert (c["status"], c["reason"]) == ("True", "Connected")


def test_lifting_the_revocation_of_a_runtime_that_never_reported_says_nothing() -> None:
    never = mapping(**{state.ANNOTATION_REVOKED: ""})
    revoked = applied(never, check(never, now=T0, limits=LIMITS))
    c = cond(revoked, "Connected")
    assert c is not None
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "Revoked",
        "an operator revoked this runtime",
    )
    lifted = Mapping.from_object(
        {**revoked.raw, "metadata": {**revoked.raw["metadata"], "annotations": {}}}
    )
    back = applied(lifted, check(lifted, now=T0 + 1, limits=LIMITS))
    assert cond(back, "Connected") is None


def test_a_runtime_without_a_token_awaits_one_and_never_reads_as_a_failed_connection() -> None:
    first = record_report(
        mapping(), report("NotFound", last_error="no token secret"), now=T0, limits=LIMITS
    )
    assert first is not None
    assert first.events == ()
    waiting = applied(mapping(), first)
    c = cond(waiting, "Connected")
    assert c is not None
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "AwaitingToken",
        "no one-time token in the runtime yet; no token secret",
    )
    assert waiting.connection is not None
    assert waiting.connection.state == "NotFound"  # what the agent said stays recorded
    # A token issued by this broker, or one the agent wrote (its digest reported), is something
    # to connect with: NotFound then means the runtime agent has not tried yet.
    tokened = mapping({"lastTokenIssuedAt": state.to_rfc3339(T0)})
    issued = applied(tokened, record_report(tokened, report("NotFound"), now=T0, limits=LIMITS))
    assert (cond(issued, "Connected") or {}).get("reason") == "NotFound"
    written = record_report(mapping(), report("NotFound", token_sha256=SHA), now=T0, limits=LIMITS)
    assert (cond(applied(mapping(), written), "Connected") or {}).get("reason") == "NotFound"


def test_state_and_connected_columns_read_the_one_connected_condition() -> None:
    """STATE must agree with CONNECTED (a revoked runtime reads Revoked, not what it last
    reported): both columns are the Connected condition's reason and status."""
    crd = yaml.safe_load(
        (
            REPO_ROOT
            / "charts/compass-broker/crds/compassmanagermappings.operator.kyma-project.io.yaml"
        ).read_text()
    )
    columns = {
        c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    condition = '.status.conditions[?(@.type=="Connected")]'
    assert columns["State"] == f"{condition}.reason"
    assert columns["Connected"] == f"{condition}.status"
    assert columns["Reported"] == ".status.connection.state"
