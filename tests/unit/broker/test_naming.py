"""Director names and labels (`registration.naming`)."""

from __future__ import annotations

import re

import pytest

from control_plane_broker.kyma import KymaView
from control_plane_broker.registration import naming


@pytest.mark.parametrize(
    ("shoot", "runtime_id", "expected"),
    [
        ("c-12ab34", "x", "c-12ab34"),
        ("My_Shoot!!Name", "x", "my-shoot-name"),
        (None, "8F0E2B6C-1234-4ABC-9DEF-0123456789AB", "kyma-8f0e2b6c-1234-4abc-9def-0123456"),
        ("123abc", "x", "kyma-123abc"),
        ("a" * 50, "x", "a" * 36),
        ("---", "", "kyma-runtime"),
        ("ab" + "-" * 40 + "c", "x", "ab-c"),
    ],
)
def test_derive_name_is_valid_for_director(
    shoot: str | None, runtime_id: str, expected: str
) -> None:
    name = naming.derive_name(shoot_name=shoot, runtime_id=runtime_id)
    assert name == expected
    assert naming.is_valid_name(name)
    assert len(name) <= 36


def _kyma(**labels: str) -> KymaView:
    return KymaView(
        name="rt-1", namespace="kcp-system", uid="u", resource_version="1", labels=labels
    )


def test_director_labels_keep_compass_manager_set_and_add_ours() -> None:
    kyma = _kyma(
        **{
            "kyma-project.io/runtime-id": "RT-1",
            "kyma-project.io/global-account-id": "ga",
            "kyma-project.io/subaccount-id": "sa",
            "kyma-project.io/shoot-name": "c-1",
            "kyma-project.io/instance-id": "inst",
            "kyma-project.io/broker-plan-id": "pid",
            "kyma-project.io/broker-plan-name": "azure",
        }
    )
    labels = naming.director_labels(
        kyma, managed_by="compass-manager", runtime_id_label="kyma_runtime_id"
    )
    assert labels == {
        "director_connection_managed_by": "compass-manager",
        "kyma_runtime_id": "RT-1",
        "broker_instance_id": "inst",
        "gardenerClusterName": "c-1",
        "global_subaccount_id": "sa",
        "global_account_id": "ga",
        "broker_plan_id": "pid",
        "broker_plan_name": "azure",
    }
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", k) for k in labels)  # Director's label keys
    assert naming.label_changes(labels, {**labels, "broker_plan_name": "aws"}) == {
        "broker_plan_name": "azure"
    }
    assert naming.label_changes(labels, labels) == {}
