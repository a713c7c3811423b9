"""Failure conditions: the pure parts that decide what is written and when an Event is due."""

from __future__ import annotations

import pytest

from control_plane_broker import errors
from control_plane_broker.director.errors import DirectorPermanent, DirectorRetryable
from control_plane_broker.kube.client import KubeUnavailable
from control_plane_broker.registration import state
from control_plane_broker.status import failure_text


def _fail(conds: list[dict[str, object]], reason: str, now: float) -> list[dict[str, object]]:
    return state.set_condition(
        conds,
        type_="Unregistered",
        status=False,
        reason=reason,
        message="m",
        now=now,
        observed_generation=3,
    )


def test_repeated_failure_writes_nothing_and_tells_nobody() -> None:
    other = {"type": "Registered", "status": "True", "reason": "R", "message": "x"}
    first = _fail([other], "CompassUnavailable", now=10)
    assert state.condition_changed([other], first, "Unregistered") == (True, True)
    assert first[0] == other  # other conditions untouched
    cond = state.find_condition(first, "Unregistered")
    assert cond is not None
    assert cond["observedGeneration"] == 3
    again = _fail(first, "CompassUnavailable", now=500)
    assert again == first  # same status, reason, message: equal, transition time kept
    assert state.condition_changed(first, again, "Unregistered") == (False, False)


def test_new_reason_is_written_and_told_new_message_only_written() -> None:
    first = _fail([], "CompassUnavailable", now=10)
    other_reason = _fail(first, "CompassRejected", now=20)
    assert state.condition_changed(first, other_reason, "Unregistered") == (True, True)
    # the status did not flip: the transition time stays
    assert other_reason[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    other_message = state.set_condition(
        first, type_="Unregistered", status=False, reason="CompassUnavailable", message="n", now=30
    )
    assert state.condition_changed(first, other_message, "Unregistered") == (True, False)


def test_flip_moves_transition_time_and_is_told() -> None:
    failed = _fail([], "CompassUnavailable", now=10)
    ok = state.set_condition(
        failed, type_="Unregistered", status=True, reason="Done", message="m", now=100
    )
    assert ok[0]["lastTransitionTime"] != failed[0]["lastTransitionTime"]
    assert state.condition_changed(failed, ok, "Unregistered") == (True, True)


@pytest.mark.parametrize(
    ("exc", "reason", "message_start"),
    [
        (DirectorRetryable("runtimes: HTTP 503"), "CompassUnavailable", "Compass is unavailable"),
        (
            errors.CompassUnavailable("circuit breaker open", retry_after=3),
            "CompassUnavailable",
            "Compass is unavailable",
        ),
        (
            DirectorPermanent("registerRuntime: invalid data", code=22),
            "CompassRejected",
            "Compass rejected the request: registerRuntime: invalid data",
        ),
        (KubeUnavailable("GET x: HTTP 503"), "ControlPlaneUnavailable", "The control plane"),
        (errors.KymaIncomplete("no label"), "KymaIncomplete", "The Kyma lacks data"),
    ],
)
def test_failure_text(exc: BaseException, reason: str, message_start: str) -> None:
    got_reason, message = failure_text(exc)
    assert got_reason == reason
    assert message.startswith(message_start)


def test_temporary_failures_share_one_message_so_retries_do_not_rewrite() -> None:
    # A Director 503 and the breaker refusing afterwards are the same outage to a reader.
    assert failure_text(DirectorRetryable("runtimes: HTTP 503")) == failure_text(
        errors.CompassUnavailable("circuit breaker open", retry_after=3)
    )


def test_condition_reasons_are_camel_case() -> None:
    assert state.failure_reason("compass-unavailable") == "CompassUnavailable"
    assert state.failure_reason("") == "Failed"
