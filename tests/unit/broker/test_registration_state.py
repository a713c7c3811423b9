"""The registration states and transitions, and the mapping as stored (`registration.state`)."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane_broker.kyma import KymaView
from control_plane_broker.registration import state
from tests.unit.broker.mapping_views import mapping_view as _mapping


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        (None, state.CreateClaimed()),
        (_mapping(compass_id="c-1"), state.Adopt("c-1")),
        (_mapping(compass_id="c-1", holder="other", expires=200), state.Adopt("c-1")),
        (_mapping(deleting=True), state.Refuse("mapping is being deleted")),
        # Recorded but on its way out: no token goes to a runtime being unregistered.
        (_mapping(compass_id="c-1", deleting=True), state.Refuse("mapping is being deleted")),
        (_mapping(holder="other", expires=130), state.Wait(retry_after=30)),
        (_mapping(holder="me", expires=130), state.Proceed(claim_expires=130)),
        (_mapping(holder="other", expires=90), state.TakeClaim("7")),
        (_mapping(holder="me", expires=90), state.TakeClaim("7")),
        (_mapping(), state.TakeClaim("7")),
    ],
)
def test_decide(mapping: state.Mapping | None, expected: state.Decision) -> None:
    assert state.decide(mapping, me="me", now=100.0) == expected


@pytest.mark.parametrize(
    ("ours", "legacy", "expected"),
    [
        ([], [], state.Register()),
        (["b"], [], state.Record("b")),
        (["c", "a", "b"], ["z"], state.Record("a", duplicates=("b", "c"))),
        ([], ["z"], state.Record("z")),
    ],
)
def test_after_lookup(ours: list[str], legacy: list[str], expected: object) -> None:
    assert state.after_lookup(ours, legacy) == expected


def test_safe_to_register_needs_claim_time_for_the_call() -> None:
    assert state.safe_to_register(claim_expires=100, now=50, call_budget=35)
    assert not state.safe_to_register(claim_expires=100, now=70, call_budget=35)


def _kyma(**labels: str) -> KymaView:
    return KymaView(
        name="rt-1", namespace="kcp-system", uid="u", resource_version="1", labels=labels
    )


def test_mapping_round_trip_claim_and_record() -> None:
    kyma = _kyma(
        **{
            "kyma-project.io/global-account-id": "ga",
            "kyma-project.io/runtime-id": "RT-1",
            "kyma-project.io/shoot-name": "c-1",
        }
    )
    obj = state.new_mapping(kyma, namespace="kcp-system", me="me", now=0, claim_seconds=60)
    obj["metadata"]["resourceVersion"] = "1"
    m = state.Mapping.from_object(obj)
    assert (m.claim_holder, m.claim_expires, m.compass_id, m.tenant) == ("me", 60.0, None, "ga")
    # Kept as the Kyma had them (case too): the sweep finds a crashed registration by them
    # in Director even after the Kyma is gone.
    assert (m.runtime_id, m.shoot) == ("RT-1", "c-1")
    assert obj["metadata"]["labels"]["kyma-project.io/runtime-id"] == "RT-1"
    assert obj["metadata"]["labels"]["kyma-project.io/shoot-name"] == "c-1"
    assert state.FINALIZER in m.finalizers
    rec = state.Mapping.from_object(state.recorded(m, compass_id="c-9"))
    assert rec.compass_id == "c-9"
    assert rec.claim_holder is None
    assert rec.resource_version == "1"  # the write is conditional on what was read
    assert state.FINALIZER not in state.Mapping.from_object(state.without_finalizer(rec)).finalizers


def test_condition_transition_time_changes_only_on_flip() -> None:
    def registered(conds: list[dict[str, Any]], status: bool, reason: str, now: float) -> Any:
        condition = state.Condition("Registered", status, reason, "m")
        return state.with_condition(conds, condition, now=now, generation=None).conditions

    c1 = registered([], True, "r", now=0)
    c2 = registered(c1, True, "r2", now=100)
    assert c2[0]["lastTransitionTime"] == c1[0]["lastTransitionTime"]
    assert c2[0]["reason"] == "r2"
    c3 = registered(c2, False, "r", now=100)
    assert c3[0]["lastTransitionTime"] != c1[0]["lastTransitionTime"]


def test_a_mapping_keeps_the_whole_object_and_hands_out_copies() -> None:
    obj = {
        "metadata": {"name": "rt-1", "resourceVersion": "7", "labels": {"x": "y"}},
        "spec": {"unknown": {"nested": [1, 2]}},
        "status": {"conditions": [{"type": "Registered", "status": "True"}]},
    }
    mapping = state.Mapping.from_object(obj)
    first = mapping.raw
    assert first == obj
    first["spec"]["unknown"]["nested"].append(3)  # a writer changes its copy ...
    assert mapping.raw == obj  # ... never the cached mapping
