"""What the broker writes on a mapping's status: the pure parts that decide what is written,
whether anything is written at all, and when an Event is due."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane_broker import errors
from control_plane_broker.director.classification import DirectorPermanent, DirectorRetryable
from control_plane_broker.kyma import KymaView
from control_plane_broker.reconciler.mapping_status import (
    TOKEN_TIMESTAMP_REFRESH,
    StatusRecorder,
    failed_status,
    failure_text,
    issued_status,
    labels_synced_status,
)
from control_plane_broker.registration import state
from control_plane_broker.registration.service import Registered
from kubeapi import Conflict, KubeUnavailable


def _fail(
    conds: list[dict[str, Any]], reason: str, now: float, message: str = "m"
) -> state.ConditionSet:
    return state.with_condition(
        conds, state.Condition("Unregistered", False, reason, message), now=now, generation=3
    )


def test_repeated_failure_writes_nothing_and_tells_nobody() -> None:
    other: dict[str, Any] = {
        "type": "Registered",
        "status": "True",
        "reason": "R",
        "message": "x",
    }
    first = _fail([other], "CompassUnavailable", now=10)
    assert (first.changed, first.news) == (True, True)
    assert first.conditions[0] == other  # other conditions untouched
    cond = state.find_condition(first.conditions, "Unregistered")
    assert cond is not None
    assert cond["observedGeneration"] == 3
    again = _fail(first.conditions, "CompassUnavailable", now=500)
    # same status, reason, message: equal, transition time kept
    assert again.conditions == first.conditions
    assert (again.changed, again.news) == (False, False)


def test_new_reason_is_written_and_told_new_message_only_written() -> None:
    first = _fail([], "CompassUnavailable", now=10).conditions
    other_reason = _fail(first, "CompassRejected", now=20)
    assert (other_reason.changed, other_reason.news) == (True, True)
    # the status did not flip: the transition time stays
    assert other_reason.conditions[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    other_message = _fail(first, "CompassUnavailable", now=30, message="n")
    assert (other_message.changed, other_message.news) == (True, False)


def test_flip_moves_transition_time_and_is_told() -> None:
    failed = _fail([], "CompassUnavailable", now=10).conditions
    ok = state.with_condition(
        failed, state.Condition("Unregistered", True, "Done", "m"), now=100, generation=None
    )
    assert ok.conditions[0]["lastTransitionTime"] != failed[0]["lastTransitionTime"]
    assert "observedGeneration" not in ok.conditions[0]  # a mapping without one: none claimed
    assert (ok.changed, ok.news) == (True, True)


def test_labels_synced_records_the_labels_and_keeps_the_other_conditions() -> None:
    failed = _fail([], "CompassUnavailable", now=10).conditions
    status = labels_synced_status(
        mapping({"conditions": failed}), written=2, desired={"a": "1"}, now=NOW
    )
    assert status["directorLabels"] == {"a": "1"}
    assert status["conditions"][0] == failed[0]
    synced = state.find_condition(status["conditions"], "LabelsSynced")
    assert synced is not None
    assert (synced["status"], synced["reason"], synced["message"]) == (
        "True",
        "LabelsSynced",
        "2 Director label(s) written",
    )
    assert synced["lastTransitionTime"] == state.to_rfc3339(NOW)
    assert synced["observedGeneration"] == 2  # the mapping's generation


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
        (Conflict("PUT x: HTTP 409"), "ControlPlaneUnavailable", "The control plane"),
        (errors.CapacityReserved("booked", retry_after=3), "CapacityBooked", "Compass capacity"),
        (errors.KymaIncomplete("no label"), "KymaIncomplete", "The Kyma lacks data"),
    ],
)
def test_failure_text(exc: BaseException, reason: str, message_start: str) -> None:
    got_reason, message = failure_text(exc)
    assert got_reason == reason
    assert message.startswith(message_start)


def test_directors_words_reach_a_condition_without_terminal_controls() -> None:
    hostile = DirectorPermanent("registerRuntime: \x1b]0;owned\x07bad\u202edata\r\n", code=22)
    _, message = failure_text(hostile)
    assert message == "Compass rejected the request: registerRuntime: ]0;ownedbaddata  "
    assert all(ch.isprintable() for ch in message)


def test_temporary_failures_share_one_message_so_retries_do_not_rewrite() -> None:
    # A Director 503 and the breaker refusing afterwards are the same outage to a reader.
    assert failure_text(DirectorRetryable("runtimes: HTTP 503")) == failure_text(
        errors.CompassUnavailable("circuit breaker open", retry_after=3)
    )


def test_condition_reasons_are_camel_case() -> None:
    assert state.failure_reason("compass-unavailable") == "CompassUnavailable"
    assert state.failure_reason("") == "Failed"


# --- status after a token: written only when it changes ---------------------------------------

NOW = 1_800_000_000.0
REGISTERED = Registered("c-1", "ga", "registered", labels={"kyma_runtime_id": "RT-1"})


def mapping(status: dict[str, Any] | None = None, **labels: str) -> state.Mapping:
    meta: dict[str, Any] = {"name": "rt-1", "resourceVersion": "7", "generation": 2}
    if labels:
        meta["labels"] = labels
    return state.Mapping.from_object({"metadata": meta, "status": status or {}})


def test_first_token_writes_the_whole_status() -> None:
    status = issued_status(mapping(), registered=REGISTERED, now=NOW)
    assert status is not None
    assert (status["registered"], status["configured"], status["state"]) == (True, True, "Ready")
    assert status["directorLabels"] == {"kyma_runtime_id": "RT-1"}
    assert status["lastTokenIssuedAt"] == state.to_rfc3339(NOW)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Registered"]["status"] == conditions["TokenIssued"]["status"] == "True"
    assert "c-1" in conditions["Registered"]["message"]
    assert conditions["Registered"]["observedGeneration"] == 2


def test_later_tokens_write_nothing_until_the_timestamp_is_due() -> None:
    written = issued_status(mapping(), registered=REGISTERED, now=NOW)
    assert written is not None
    after = mapping(written)
    adopted = Registered("c-1", "ga", "adopted")  # what a known runtime's token path has
    for later in (NOW + 1, NOW + TOKEN_TIMESTAMP_REFRESH - 1):
        assert issued_status(after, registered=adopted, now=later) is None
        assert issued_status(after, registered=REGISTERED, now=later) is None
    due = issued_status(after, registered=adopted, now=NOW + TOKEN_TIMESTAMP_REFRESH)
    assert due is not None
    assert due["lastTokenIssuedAt"] == state.to_rfc3339(NOW + TOKEN_TIMESTAMP_REFRESH)
    assert due["directorLabels"] == written["directorLabels"]  # kept, not dropped
    assert due["conditions"] == written["conditions"]  # transition times kept


def test_a_change_is_written_at_once_with_the_old_timestamp() -> None:
    written = issued_status(mapping(), registered=REGISTERED, now=NOW)
    assert written is not None
    failed = mapping(
        {
            **written,
            "conditions": state.with_condition(
                written["conditions"],
                state.Condition("TokenIssued", False, "CompassUnavailable", "m"),
                now=NOW + 5,
                generation=None,
            ).conditions,
        }
    )
    healed = issued_status(failed, registered=REGISTERED, now=NOW + 10)
    assert healed is not None
    assert state.find_condition(healed["conditions"], "TokenIssued")["status"] == "True"  # type: ignore[index]
    # Within the refresh period the timestamp is not what made the write.
    assert healed["lastTokenIssuedAt"] == state.to_rfc3339(NOW)
    relabelled = Registered("c-1", "ga", "registered", labels={"kyma_runtime_id": "RT-2"})
    changed = issued_status(mapping(written), registered=relabelled, now=NOW + 10)
    assert changed is not None
    assert changed["directorLabels"] == {"kyma_runtime_id": "RT-2"}


def test_failed_status_writes_and_tells_only_news() -> None:
    first, tell = failed_status(
        mapping(),
        condition="TokenIssued",
        reason="CompassUnavailable",
        message="Compass is unavailable; will retry",
        now=NOW,
        director_labels=None,
    )
    assert first is not None
    assert tell
    assert set(first) == {"conditions"}
    again, tell = failed_status(
        mapping(first),
        condition="TokenIssued",
        reason="CompassUnavailable",
        message="Compass is unavailable; will retry",
        now=NOW + 100,
        director_labels=None,
    )
    assert (again, tell) == (None, False)


def test_failed_status_records_director_labels_only_when_they_differ() -> None:
    labels = {"kyma_runtime_id": "RT-1"}
    status, _ = failed_status(
        mapping(),
        condition="TokenIssued",
        reason="CompassUnavailable",
        message="m",
        now=NOW,
        director_labels=labels,
    )
    assert status is not None
    assert status["directorLabels"] == labels
    # Same failure, labels already there: nothing to write.
    status_after = {**status, "directorLabels": labels}
    again, tell = failed_status(
        mapping(status_after),
        condition="TokenIssued",
        reason="CompassUnavailable",
        message="m",
        now=NOW + 1,
        director_labels=labels,
    )
    assert (again, tell) == (None, False)
    # Same failure, other labels sent: the labels are written, nobody is told again.
    other, tell = failed_status(
        mapping(status_after),
        condition="TokenIssued",
        reason="CompassUnavailable",
        message="m",
        now=NOW + 2,
        director_labels={"kyma_runtime_id": "RT-2"},
    )
    assert other == {"directorLabels": {"kyma_runtime_id": "RT-2"}}
    assert not tell


class _Writes:
    """A mapping repository that records status writes and refuses to be read."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, str | None]] = []
        self.refusal: Exception | None = None

    async def get(self, name: str) -> state.Mapping | None:
        raise AssertionError(f"read {name}: the registration's own write was fresher")

    async def patch_status(
        self, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> None:
        self.patched.append((name, resource_version))
        if self.refusal is not None:
            raise self.refusal


class _NoCache:
    def get(self, name: str) -> state.Mapping | None:
        return None  # the watch has not delivered the new mapping yet


class _Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def emit(self, *, kyma_name: str, kyma_uid: str, reason: str, message: str) -> None:
        self.reasons.append(reason)


async def test_a_new_registration_writes_its_status_on_its_own_write_without_reading() -> None:
    repo, events = _Writes(), _Events()
    recorder = StatusRecorder(
        repo=repo,  # type: ignore[arg-type]
        cache=_NoCache(),
        events=events,  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    recorded = state.Mapping.from_object(
        {"metadata": {"name": "rt-1", "resourceVersion": "42", "generation": 2}}
    )
    registered = Registered("c-1", "ga", "registered", {"kyma_runtime_id": "RT-1"}, recorded)
    kyma = KymaView.from_object({"metadata": {"name": "rt-1", "uid": "u-1"}})
    await recorder.issued(kyma=kyma, registered=registered)
    assert repo.patched == [("rt-1", "42")]  # conditional on the version it wrote, no GET
    assert events.reasons == ["RuntimeRegistered"]


async def test_label_sync_writes_on_the_version_it_judged_and_lets_a_conflict_through() -> None:
    repo = _Writes()
    recorder = StatusRecorder(
        repo=repo,  # type: ignore[arg-type]
        cache=_NoCache(),
        events=_Events(),  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    await recorder.labels_synced(mapping(), written=1, desired={"a": "1"})
    assert repo.patched == [("rt-1", "7")]  # conditional, no read
    # Unlike the best-effort writes: the reconciler backs off and judges the labels again.
    repo.refusal = Conflict("changed meanwhile")
    with pytest.raises(Conflict):
        await recorder.labels_synced(mapping(), written=1, desired={"a": "1"})
