"""Each use case's settings group (`settings.*Settings`) carries the values of the `Settings`
fields it names, so splitting the settings by concern changes no value a use case sees."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from control_plane_broker.settings import (
    ModuleSettings,
    ReconcilerSettings,
    RegistrationSettings,
    ReportSettings,
    Settings,
)

# Every value off its default, so a group that read the wrong field or a default would show.
SETTINGS = Settings(
    kcp_namespace="kcp-test",
    registration_claim_seconds=301,
    tenant_recheck_seconds=61,
    runtime_id_label="example.com/runtime",
    managed_by_label_value="broker-test",
    director_timeout_seconds=7,
    director_queue_timeout_seconds=3,
    sweep_interval_seconds=123,
    connection_check_interval_seconds=45,
    module_name="other-module",
    module_policy="ignored",
    module_disabled_policy="unregister",
    report_interval_seconds=91,
    report_min_interval_seconds=11,
    report_refresh_seconds=601,
    report_stale_seconds=1801,
    connect_deadline_seconds=333,
)


def flat(group: Any) -> dict[str, Any]:
    """The group's fields that name a `Settings` field, nested groups included."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(group):
        value = getattr(group, field.name)
        out |= flat(value) if dataclasses.is_dataclass(value) else {field.name: value}
    return out


@pytest.mark.parametrize(
    "group",
    [
        SETTINGS.module_settings(),
        SETTINGS.report_settings(),
        SETTINGS.registration_settings(),
        SETTINGS.reconciler_settings(),
    ],
    ids=lambda group: type(group).__name__,
)
def test_a_group_holds_the_values_of_the_settings_it_names(group: Any) -> None:
    # module_required is derived from BROKER_MODULE_POLICY (below).
    named = {name: value for name, value in flat(group).items() if name != "module_required"}
    assert named == {name: getattr(SETTINGS, name) for name in named}
    # Each off its default: a group that read a default instead would show above.
    assert all(getattr(SETTINGS, name) != Settings.model_fields[name].default for name in named)


def test_the_module_is_required_only_by_the_required_policy() -> None:
    assert not SETTINGS.module_settings().module_required
    assert Settings(module_policy="required").module_settings().module_required


def test_the_groups_are_frozen() -> None:
    for group in (
        SETTINGS.module_settings(),
        SETTINGS.report_settings(),
        SETTINGS.registration_settings(),
        SETTINGS.reconciler_settings(),
    ):
        assert isinstance(
            group, ModuleSettings | ReportSettings | RegistrationSettings | ReconcilerSettings
        )
        with pytest.raises(dataclasses.FrozenInstanceError):
            group.kcp_namespace = "x"  # type: ignore[misc,union-attr]
