"""Pure parts of the Kubernetes layer: lease judgement and spec, event texts, store diffs,
and the public names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import kubeapi
from kubeapi.event_recorder import truncate_utf8
from kubeapi.informer import changed_names
from kubeapi.lease import LeaseRecord, held_by_other, lease_spec, micro_time

NOW = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def record(**spec: Any) -> LeaseRecord:
    return LeaseRecord.from_object({"spec": spec, "metadata": {"resourceVersion": "5"}})


@pytest.mark.parametrize(
    ("spec", "observed_at", "now", "held"),
    [
        ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 100.0, 114.9, True),
        ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 100.0, 115.0, False),
        # The holder's own clock says nothing: a renewTime in the far future or past is only
        # a change to observe, never a verdict.
        (
            {"holderIdentity": "other", "renewTime": "2999-01-01T00:00:00.000000Z"},
            100.0,
            110.0,
            True,
        ),
        (
            {"holderIdentity": "other", "renewTime": "1999-01-01T00:00:00.000000Z"},
            100.0,
            110.0,
            True,
        ),
        ({"holderIdentity": "other", "leaseDurationSeconds": "garbage"}, 100.0, 129.0, True),
        ({"holderIdentity": "other", "leaseDurationSeconds": -5}, 100.0, 131.0, False),
        ({"holderIdentity": "me", "leaseDurationSeconds": 15}, 100.0, 101.0, False),
        ({"holderIdentity": ""}, 100.0, 100.0, False),
        ({}, 100.0, 100.0, False),
    ],
)
def test_held_by_other_is_judged_by_our_observation_time(
    spec: dict[str, Any], observed_at: float, now: float, held: bool
) -> None:
    assert (
        held_by_other(
            record(**spec), me="me", observed_at=observed_at, now=now, default_duration=30.0
        )
        is held
    )


@pytest.mark.parametrize("garbage", [None, [], "x", {"spec": "x"}, {"spec": {"holderIdentity": 3}}])
def test_a_malformed_lease_reads_as_free(garbage: Any) -> None:
    parsed = LeaseRecord.from_object(garbage if isinstance(garbage, dict) else {"spec": garbage})
    assert parsed.holder is None
    assert parsed.transitions == 0


def test_lease_spec_counts_transitions_only_when_the_holder_changes() -> None:
    taken = lease_spec(
        {"holderIdentity": "other", "leaseTransitions": 3, "strategy": "OldestEmulationVersion"},
        me="me",
        duration=15.4,
        now=NOW,
    )
    assert taken == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-05-01T12:00:00.123456Z",
        "acquireTime": "2026-05-01T12:00:00.123456Z",
        "leaseTransitions": 4,
        "strategy": "OldestEmulationVersion",
    }
    renewed = lease_spec(taken, me="me", duration=15, now=NOW.replace(second=5))
    assert renewed["leaseTransitions"] == 4
    assert renewed["acquireTime"] == taken["acquireTime"]
    assert renewed["renewTime"] == micro_time(NOW.replace(second=5))
    assert lease_spec(None, me="me", duration=15, now=NOW)["leaseTransitions"] == 0


def test_event_messages_are_cut_to_1_kib_without_splitting_characters() -> None:
    assert truncate_utf8("ä" * 600) == "ä" * 512
    assert len(truncate_utf8("x" * 5000).encode()) == 1024
    assert truncate_utf8("short") == "short"


def test_changed_names_include_missed_deletions_additions_and_changes() -> None:
    before = {"kept": "1", "changed": "2", "deleted": "3"}
    after = {"kept": "1", "changed": "4", "added": "5"}
    assert changed_names(before, after) == ["added", "changed", "deleted"]


def test_public_names_are_the_intended_ones() -> None:
    assert set(kubeapi.__all__) == {
        "JSON",
        "ClusterAccess",
        "Conflict",
        "EventRecorder",
        "Gone",
        "Informer",
        "KubeClient",
        "KubeError",
        "KubeRejected",
        "KubeUnavailable",
        "KubeconfigError",
        "LeaderElector",
        "Listing",
        "NotFound",
        "ObjectRef",
        "WatchEvent",
        "access_from_kubeconfig_file",
        "access_from_untrusted_kubeconfig",
        "describe_transport_error",
        "in_cluster_access",
        "load_access",
    }
    defined = {
        name
        for name, value in vars(kubeapi).items()
        if not name.startswith("_") and not isinstance(value, type(kubeapi))
    }
    assert defined == set(kubeapi.__all__)  # nothing public besides what is exported
