"""Director name and labels for a Kyma: pure and deterministic (the same Kyma, the same answer).

Names obey Director's rules: at most 36 characters of `a-z 0-9 - .`, not starting with a digit.
Label keys are alphanumeric with underscore. compass-manager's label set is kept; ours is added.
"""

from __future__ import annotations

import re

from control_plane_broker.kyma import (
    LABEL_GLOBAL_ACCOUNT,
    LABEL_INSTANCE,
    LABEL_PLAN_ID,
    LABEL_PLAN_NAME,
    LABEL_SHOOT,
    LABEL_SUBACCOUNT,
    KymaView,
)

MAX_NAME = 36
_NAME = re.compile(r"^[a-z][a-z0-9.-]{0,35}$")

# Director label key -> Kyma label it comes from (compass-manager's set).
LABEL_SOURCES: dict[str, str] = {
    "broker_instance_id": LABEL_INSTANCE,
    "gardenerClusterName": LABEL_SHOOT,
    "global_subaccount_id": LABEL_SUBACCOUNT,
    "global_account_id": LABEL_GLOBAL_ACCOUNT,
    "broker_plan_id": LABEL_PLAN_ID,
    "broker_plan_name": LABEL_PLAN_NAME,
}
MANAGED_BY = "director_connection_managed_by"


def is_valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def derive_name(*, shoot_name: str | None, runtime_id: str) -> str:
    """The shoot name made valid; the runtime ID when there is no shoot (BYOC)."""
    base = (shoot_name or runtime_id or "").lower()
    base = re.sub(r"[^a-z0-9.-]+", "-", base)
    base = re.sub(r"-{2,}", "-", base).strip("-.")
    if not base or not base[0].isalpha():
        base = f"kyma-{base}" if base else "kyma-runtime"
    name = base[:MAX_NAME].rstrip("-.")
    assert is_valid_name(name), name
    return name


def director_labels(kyma: KymaView, *, managed_by: str, runtime_id_label: str) -> dict[str, str]:
    labels = {MANAGED_BY: managed_by, runtime_id_label: kyma.runtime_id}
    for key, source in LABEL_SOURCES.items():
        value = kyma.labels.get(source)
        if value:
            labels[key] = value
    return labels


def label_changes(desired: dict[str, str], recorded: dict[str, str]) -> dict[str, str]:
    """Labels to write: those whose value differs from what was last written."""
    return {k: v for k, v in sorted(desired.items()) if recorded.get(k) != v}
