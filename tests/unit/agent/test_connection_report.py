"""`agent.connection_report`: connection reports built from any CompassConnection (hostile ones
too), their body as the contract has it, and when they are due (change, heartbeat, jitter,
backoff)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cluster_objects import Connection, TokenRecord
from agent.connection_report import (
    MAX_BODY_BYTES,
    MAX_ERROR_CHARS,
    NOT_FOUND,
    Schedule,
    after_accepted,
    after_failure,
    build_report,
    due_at,
)
from agent.retry_policy import RetryPolicy

NOW = datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC)
SECONDS = timedelta(seconds=1)
CONTRACT_FIELDS = {
    "connectionState",
    "certificateNotAfter",
    "lastError",
    "tokenSha256",
    "observedAt",
}
CONTRACT_STATES = {
    "Connected",
    "ConnectionFailed",
    "ConnectionMaintenanceFailed",
    "SynchronizationFailed",
    "ResourceApplicationFailed",
    "MetadataUpdateFailed",
    "Synchronized",
    "NotFound",
}


def compass_connection(status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "compass.kyma-project.io/v1alpha1",
        "kind": "CompassConnection",
        "metadata": {"name": "compass-connection"},
        "status": status,
    }


def report_of(raw: Any, token: TokenRecord | None = None) -> dict[str, Any]:
    report = build_report(None if raw is None else Connection.from_object(raw), token, now=NOW)
    body = report.body()
    assert len(body) <= MAX_BODY_BYTES
    document = json.loads(body.decode("utf-8"))
    assert set(document) <= CONTRACT_FIELDS
    assert document["connectionState"] in CONTRACT_STATES
    return document  # type: ignore[no-any-return]


def our_secret(token: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app.kubernetes.io/managed-by": "compass-agent"}},
        "data": {"TOKEN": base64.b64encode(token.encode()).decode()},
    }


HOLDING_A_TOKEN = TokenRecord.from_secret(our_secret("ott-secret-value"))


# -- what a report says --------------------------------------------------------------------------


def test_a_connected_runtime_reports_state_certificate_and_token_hash_never_the_token() -> None:
    raw = compass_connection(
        {
            "connectionState": "Connected",
            "connectionStatus": {
                "certificateStatus": {"notAfter": "2027-01-01T01:00:00+01:00"},
                "error": "",
            },
        }
    )
    token = TokenRecord.from_secret(our_secret("ott-secret-value"))
    document = report_of(raw, token)
    assert document == {
        "connectionState": "Connected",
        "certificateNotAfter": "2027-01-01T00:00:00.000Z",
        "tokenSha256": hashlib.sha256(b"ott-secret-value").hexdigest(),
        "observedAt": "2026-12-03T15:00:00.000Z",
    }
    assert (
        b"ott-secret-value" not in build_report(Connection.from_object(raw), token, now=NOW).body()
    )


def test_no_compass_connection_is_not_found() -> None:
    assert report_of(None) == {
        "connectionState": NOT_FOUND,
        "observedAt": "2026-12-03T15:00:00.000Z",
    }


def test_the_runtime_agents_error_is_reported_and_truncated_to_1024_chars() -> None:
    raw = compass_connection(
        {"connectionState": "ConnectionFailed", "connectionStatus": {"error": "x" * 5000}}
    )
    document = report_of(raw, HOLDING_A_TOKEN)
    assert document["connectionState"] == "ConnectionFailed"
    assert document["lastError"] == "x" * MAX_ERROR_CHARS


def test_multibyte_errors_are_cut_further_to_keep_the_body_within_4_kib() -> None:
    raw = compass_connection(
        {"connectionState": "ConnectionFailed", "connectionStatus": {"error": "😀" * 2000}}
    )
    document = report_of(raw, HOLDING_A_TOKEN)
    assert 0 < len(document["lastError"]) < MAX_ERROR_CHARS
    assert set(document["lastError"]) == {"😀"}


def test_lone_surrogates_and_control_characters_do_not_break_the_body() -> None:
    # json.loads (what the API client does) turns "\ud800" into a lone surrogate.
    error = r"bad \ud800 \u0000\u001b[31m red\nline"
    status = json.loads(
        '{"connectionState": "ConnectionFailed", "connectionStatus": {"error": "' + error + '"}}'
    )
    document = report_of(compass_connection(status), HOLDING_A_TOKEN)
    assert document["lastError"] == "bad ? \x20\x20[31m red\nline"


def test_connection_failed_without_a_token_secret_is_not_tried_yet_not_a_failure() -> None:
    raw = compass_connection(
        {
            "connectionState": "ConnectionFailed",
            "connectionStatus": {"error": "Failed to retrieve certificate: secret not found"},
        }
    )
    assert report_of(raw) == {
        "connectionState": NOT_FOUND,
        "lastError": "no token in the runtime yet; CompassConnection: Failed to retrieve "
        "certificate: secret not found",
        "observedAt": "2026-12-03T15:00:00.000Z",
    }
    long = compass_connection(
        {"connectionState": "ConnectionFailed", "connectionStatus": {"error": "x" * 5000}}
    )
    assert len(report_of(long)["lastError"]) == MAX_ERROR_CHARS
    # With a token secret (the agent's or anyone's) the failure is about that token.
    someone_elses = TokenRecord.from_secret({"data": {"TOKEN": "b3R0"}})
    assert report_of(raw, someone_elses)["connectionState"] == "ConnectionFailed"
    assert report_of(raw, HOLDING_A_TOKEN)["connectionState"] == "ConnectionFailed"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({}, "CompassConnection has no status.connectionState"),
        ({"connectionState": ""}, "CompassConnection has no status.connectionState"),
        ({"connectionState": 7}, "CompassConnection has no status.connectionState"),
        ({"connectionState": "Bogus"}, "CompassConnection has an unknown connectionState: Bogus"),
        ({"connectionState": "Bogus", "connectionStatus": {"error": "boom"}}, "boom"),
    ],
)
def test_a_missing_or_unknown_state_is_reported_as_not_found_with_the_reason(
    status: dict[str, Any], error: str
) -> None:
    document = report_of(compass_connection(status))
    assert document["connectionState"] == NOT_FOUND
    assert document["lastError"] == error


def test_a_huge_unknown_state_is_quoted_only_in_part() -> None:
    document = report_of(compass_connection({"connectionState": "S" * 100_000}))
    assert document["connectionState"] == NOT_FOUND
    assert len(document["lastError"]) < 200


@pytest.mark.parametrize(
    "not_after",
    [None, 17, "", "tomorrow", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", ["x"]],
)
def test_an_unusable_certificate_time_is_left_out(not_after: object) -> None:
    raw = compass_connection(
        {
            "connectionState": "Connected",
            "connectionStatus": {"certificateStatus": {"notAfter": not_after}},
        }
    )
    assert "certificateNotAfter" not in report_of(raw)


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"status": None},
        {"status": "Connected"},
        {"status": ["Connected"]},
        {"status": {"connectionState": ["Connected"], "connectionStatus": "broken"}},
        {"status": {"connectionState": "Connected", "connectionStatus": {"error": 42}}},
        {"status": {"connectionStatus": {"certificateStatus": "soon"}}},
        [],
        "compass-connection",
    ],
)
def test_objects_of_the_wrong_shape_never_raise(raw: Any) -> None:
    report_of(raw)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    state=st.one_of(st.sampled_from(sorted(CONTRACT_STATES)), _json),
    error=st.one_of(st.text(max_size=3000), _json),
    not_after=st.one_of(st.datetimes().map(lambda d: d.isoformat()), st.text(max_size=40), _json),
)
def test_any_compass_connection_gives_a_valid_report(
    state: Any, error: Any, not_after: Any
) -> None:
    raw = compass_connection(
        {
            "connectionState": state,
            "connectionStatus": {"error": error, "certificateStatus": {"notAfter": not_after}},
        }
    )
    document = report_of(raw)
    assert len(document.get("lastError", "")) <= MAX_ERROR_CHARS


@pytest.mark.parametrize(
    "secret",
    [
        {"metadata": {}, "data": {"TOKEN": base64.b64encode(b"theirs").decode()}},  # not ours
        {"metadata": {"labels": {"app.kubernetes.io/managed-by": "compass-agent"}}, "data": {}},
        {
            "metadata": {"labels": {"app.kubernetes.io/managed-by": "compass-agent"}},
            "data": {"TOKEN": "not base64!"},
        },
        {
            "metadata": {"labels": {"app.kubernetes.io/managed-by": "compass-agent"}},
            "data": {"TOKEN": 12},
        },
        {"metadata": {"labels": {"app.kubernetes.io/managed-by": "compass-agent"}}, "data": "x"},
    ],
)
def test_no_token_hash_without_a_token_the_agent_wrote(secret: dict[str, Any]) -> None:
    assert TokenRecord.from_secret(secret).token_sha256 is None
    assert "tokenSha256" not in report_of(None, TokenRecord.from_secret(secret))


# -- when ------------------------------------------------------------------------------------------

POLICY = RetryPolicy(base=1.0, factor=2.0, cap=300.0)
KEY = ("Connected", None, None, "ab" * 32)
OTHER = ("ConnectionFailed", None, "boom", "ab" * 32)


class Fixed:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def uniform(self, a: float, b: float, /) -> float:
        return a + (b - a) * self.fraction


def test_the_first_report_is_due_at_once() -> None:
    assert due_at(Schedule(), KEY, now=NOW) == NOW


def test_an_accepted_state_is_due_again_at_the_heartbeat_a_change_at_once() -> None:
    schedule = after_accepted(KEY, now=NOW, interval=300, broker_wish=None, rng=Fixed(0.5))
    assert due_at(schedule, KEY, now=NOW + SECONDS) == NOW + 300 * SECONDS
    assert due_at(schedule, OTHER, now=NOW + SECONDS) == NOW + SECONDS


@pytest.mark.parametrize(
    ("interval", "wish", "period"),
    [(300, None, 300), (300, 60, 60), (300, 3600, 300), (5, 5, 5)],
)
@pytest.mark.parametrize(("fraction", "factor"), [(0.0, 0.8), (0.5, 1.0), (1.0, 1.2)])
def test_the_heartbeat_is_the_shorter_of_both_periods_with_20_percent_jitter(
    interval: float, wish: float | None, period: float, fraction: float, factor: float
) -> None:
    schedule = after_accepted(
        KEY, now=NOW, interval=interval, broker_wish=wish, rng=Fixed(fraction)
    )
    assert schedule.heartbeat_at == NOW + timedelta(seconds=period * factor)


def test_heartbeats_spread_across_the_jitter_window() -> None:
    rng = random.Random(13)
    heartbeats = [
        (after_accepted(KEY, now=NOW, interval=300, broker_wish=None, rng=rng).heartbeat_at - NOW)
        for _ in range(500)
    ]
    seconds = [h.total_seconds() for h in heartbeats if h is not None]
    assert min(seconds) >= 240
    assert max(seconds) <= 360
    assert max(seconds) - min(seconds) > 100  # really spread, not one value


def test_failures_back_off_with_the_retry_policy_and_a_change_waits_too() -> None:
    schedule = after_accepted(KEY, now=NOW, interval=300, broker_wish=None, rng=Fixed(0.5))
    waits = []
    for _ in range(5):
        schedule = after_failure(schedule, now=NOW, policy=POLICY, rng=Fixed(1.0))
        assert schedule.not_before is not None
        waits.append((schedule.not_before - NOW).total_seconds())
        # A changed state does not jump the backoff: no spinning on a flapping connection.
        assert due_at(schedule, OTHER, now=NOW) == schedule.not_before
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_retry_after_is_honoured_beyond_the_own_backoff() -> None:
    schedule = after_failure(Schedule(), now=NOW, policy=POLICY, retry_after=30.0, rng=Fixed(0.0))
    assert schedule.not_before == NOW + 30 * SECONDS
    assert due_at(schedule, KEY, now=NOW + 29 * SECONDS) == NOW + 30 * SECONDS


def test_an_accepted_report_ends_the_backoff() -> None:
    failed = after_failure(Schedule(), now=NOW, policy=POLICY, retry_after=30.0)
    schedule = after_accepted(KEY, now=NOW, interval=300, broker_wish=None, rng=Fixed(0.5))
    assert failed.failures == 1
    assert schedule.failures == 0
    assert schedule.not_before is None
    assert due_at(schedule, OTHER, now=NOW) == NOW
