"""Director's refusals that the broker remembers or recovers from, as pure rules: an unknown
global account or subaccount (no Director call until the Kyma changes or the recheck period
passes), a runtime gone from Director (its ID forgotten on the mapping), and the labels a
runtime found by look-up already holds (not written again)."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane_broker.director.answers import DirectorRuntime
from control_plane_broker.director.classification import DirectorPermanent, DirectorTenantUnknown
from control_plane_broker.errors import CompassTenantUnknown
from control_plane_broker.kyma import LABEL_GLOBAL_ACCOUNT, LABEL_SUBACCOUNT, KymaView
from control_plane_broker.reconciler.mapping_status import failed_status, issued_status
from control_plane_broker.registration import state
from control_plane_broker.registration.service import Registered, labels_held, refusal_of_tenants

NOW = 1_700_000_000.0


def kyma(*, ga: str = "ga", sa: str | None = "sa") -> KymaView:
    labels = {LABEL_GLOBAL_ACCOUNT: ga, "kyma-project.io/runtime-id": "RT-1"}
    if sa is not None:
        labels[LABEL_SUBACCOUNT] = sa
    return KymaView("rt-1", "kcp-system", "uid", "1", labels)


REFUSAL = state.TenantRefusal(
    global_account="ga", subaccount="sa", label=LABEL_SUBACCOUNT, value="sa", at=NOW
)


def mapping(**status: Any) -> state.Mapping:
    return state.Mapping.from_object(
        {
            "metadata": {
                "name": "rt-1",
                "resourceVersion": "7",
                "labels": {
                    "kyma-project.io/compass-runtime-id": "dead-id",
                    LABEL_GLOBAL_ACCOUNT: "ga",
                },
                "annotations": {
                    state.ANNOTATION_REGISTERED_LABELS: '{"a": "b"}',
                    "keep": "me",
                },
                "finalizers": [state.FINALIZER],
            },
            "status": status,
        }
    )


@pytest.mark.parametrize(
    ("refusal", "view", "now", "stands"),
    [
        (REFUSAL, kyma(), NOW + 10, True),
        (REFUSAL, kyma(), NOW + 899, True),
        (REFUSAL, kyma(), NOW + 900, False),  # the recheck period is over
        (REFUSAL, kyma(sa="other"), NOW + 10, False),  # the Kyma names another subaccount
        (REFUSAL, kyma(ga="other"), NOW + 10, False),
        (REFUSAL, kyma(sa=None), NOW + 10, False),
        (REFUSAL, kyma(), NOW - 5, False),  # a refusal from the future is not trusted
        (None, kyma(), NOW, False),
    ],
)
def test_a_tenant_refusal_stands_until_the_kyma_changes_or_the_recheck_period_passes(
    refusal: state.TenantRefusal | None, view: KymaView, now: float, stands: bool
) -> None:
    assert state.refusal_stands(refusal, view, now=now, recheck_seconds=900) is stands


def test_a_tenant_refusal_round_trips_through_the_status_and_broken_ones_are_ignored() -> None:
    assert state.TenantRefusal.parse(REFUSAL.to_status()) == REFUSAL
    parsed = mapping(compassRefusal=REFUSAL.to_status())
    assert parsed.tenant_refusal == REFUSAL
    for broken in ("x", {"globalAccount": "ga"}, {**REFUSAL.to_status(), "at": "yesterday"}, None):
        assert state.TenantRefusal.parse(broken) is None


def test_the_refusal_is_written_with_the_failure_and_cleared_by_a_token() -> None:
    before = mapping()
    status, tell = failed_status(
        before,
        condition="Registered",
        reason="CompassTenantUnknown",
        message="Compass does not know the subaccount 'sa'",
        now=NOW,
        director_labels=None,
        refusal=REFUSAL,
    )
    assert tell
    assert status is not None
    assert status["compassRefusal"] == REFUSAL.to_status()
    # The same refusal again writes nothing and tells nobody.
    again, tell_again = failed_status(
        mapping(conditions=status["conditions"], compassRefusal=status["compassRefusal"]),
        condition="Registered",
        reason="CompassTenantUnknown",
        message="Compass does not know the subaccount 'sa'",
        now=NOW + 60,
        director_labels=None,
        refusal=REFUSAL,
    )
    assert (again, tell_again) == (None, False)
    after = issued_status(
        mapping(compassRefusal=REFUSAL.to_status()),
        registered=Registered("new-id", "ga", "registered"),
        now=NOW,
    )
    assert after is not None
    assert after["compassRefusal"] is None  # a merge patch removes it


def test_a_forgotten_mapping_keeps_everything_but_the_lost_runtime() -> None:
    obj = state.forgotten(mapping())
    meta = obj["metadata"]
    assert "kyma-project.io/compass-runtime-id" not in meta["labels"]
    assert meta["labels"][LABEL_GLOBAL_ACCOUNT] == "ga"
    assert state.ANNOTATION_REGISTERED_LABELS not in meta["annotations"]
    assert meta["annotations"]["keep"] == "me"
    assert meta["finalizers"] == [state.FINALIZER]
    assert meta["resourceVersion"] == "7"  # replaced only if nobody changed it meanwhile
    assert state.decide(state.Mapping.from_object(obj), me="b", now=NOW) == state.TakeClaim("7")


def test_a_revoked_mapping_kept_after_unregistering_holds_only_the_revocation() -> None:
    held = mapping()
    raw = held.raw
    raw["metadata"]["annotations"].update(
        {
            state.ANNOTATION_REVOKED: "leaked credentials",
            state.ANNOTATION_UNREGISTER: "please",
            state.ANNOTATION_HOLDER: "broker-a",
            state.ANNOTATION_EXPIRES: "2023-11-14T22:13:20Z",
        }
    )
    kept = state.Mapping.from_object(state.unregistered_but_revoked(state.Mapping.from_object(raw)))
    assert kept.revoked == "leaked credentials"
    assert kept.compass_id is None
    assert kept.unregister is None  # carried out: asking again would unregister nothing
    assert kept.claim_holder is None
    assert kept.finalizers == (state.FINALIZER,)  # the Kyma's deletion still cleans up
    assert kept.resource_version == "7"


def test_labels_held_by_a_runtime_found_are_recorded_as_synced() -> None:
    found = DirectorRuntime(
        id="c-1",
        name="n",
        labels={
            "kyma_runtime_id": "RT-1",
            "global_subaccount_id": "sa",
            "runtimeType": "kyma",  # Director's own: not ours to record
            "broker_plan_id": ["a", "list"],  # not what we would write
        },
    )
    wanted = {"kyma_runtime_id": "RT-1", "global_subaccount_id": "sa", "broker_plan_id": "p"}
    assert labels_held(found, wanted=wanted) == {
        "kyma_runtime_id": "RT-1",
        "global_subaccount_id": "sa",
    }
    assert labels_held(DirectorRuntime(id="c-2", name="n"), wanted=wanted) == {}


@pytest.mark.parametrize(
    ("exc", "label", "value"),
    [
        (DirectorTenantUnknown("Tenant not found", code=25), LABEL_GLOBAL_ACCOUNT, "ga"),
        (
            DirectorTenantUnknown("Object not found [object=tenant]", code=20),
            LABEL_SUBACCOUNT,
            "sa",
        ),
        (
            DirectorPermanent("should be child of the caller tenant", code=27),
            LABEL_SUBACCOUNT,
            "sa",
        ),
        (DirectorPermanent("invalid data", code=22), None, None),
    ],
)
def test_registration_refusals_that_name_the_kymas_tenants(
    exc: DirectorPermanent, label: str | None, value: str | None
) -> None:
    refusal = refusal_of_tenants(exc, kyma(), "ga")
    if label is None:
        assert refusal is None
        return
    assert isinstance(refusal, CompassTenantUnknown)
    assert (refusal.label, refusal.value) == (label, value)
    assert label in str(refusal)
    assert repr(value) in str(refusal)


@pytest.mark.parametrize(
    ("created_at", "watched_since", "vanished", "new"),
    [
        (NOW + 60, NOW, False, True),  # created while we watched, never seen to go
        (NOW + 60, NOW, True, False),  # its mapping was deleted (force-deleted) meanwhile
        (NOW - 60, NOW, False, False),  # existed before we looked: a mapping may have been
        (NOW + 1, NOW, False, False),  # within the clock skew: not certain
        (None, NOW, False, False),
        (NOW + 60, None, False, False),  # the watch has not listed yet
    ],
)
def test_a_runtime_is_certainly_new_only_if_no_mapping_of_it_can_have_gone_unseen(
    created_at: float | None, watched_since: float | None, vanished: bool, new: bool
) -> None:
    assert (
        state.certainly_new(created_at=created_at, watched_since=watched_since, vanished=vanished)
        is new
    )


def test_the_unregister_annotation_is_read_and_an_adopted_mapping_records_the_runtime() -> None:
    obj = state.adopted_mapping(kyma(), namespace="kcp-system", compass_id="c-1")
    adopted = state.Mapping.from_object(obj)
    assert adopted.compass_id == "c-1"
    assert adopted.finalizers == (state.FINALIZER,)
    assert adopted.unregister is None
    assert state.decide(adopted, me="b", now=NOW) == state.Adopt("c-1")
    obj["metadata"]["annotations"][state.ANNOTATION_UNREGISTER] = ""
    assert state.Mapping.from_object(obj).unregister == ""
