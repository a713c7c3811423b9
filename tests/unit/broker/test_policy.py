"""Runtime ID and token policy (`policy`)."""

from __future__ import annotations

import pytest

from control_plane_broker import errors
from control_plane_broker.kyma import KymaView
from control_plane_broker.policy import check_token_allowed, validate_runtime_id


@pytest.mark.parametrize(
    ("runtime_id", "ok"),
    [
        ("8F0E2B6C-1234-4ABC-9DEF-0123456789AB", True),
        ("a", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-abc", False),
        ('abc"}', False),
        ("abc/def", False),
        ("", False),
        ("abc_def", False),
    ],
)
def test_runtime_id_validation(runtime_id: str, ok: bool) -> None:
    if ok:
        assert validate_runtime_id(runtime_id) == runtime_id.lower()
    else:
        with pytest.raises(errors.MalformedRequest):
            validate_runtime_id(runtime_id)


GA = {"kyma-project.io/global-account-id": "ga"}


@pytest.mark.parametrize(
    ("kyma", "required", "error"),
    [
        (None, True, errors.RuntimeNotFound),
        (
            KymaView(
                "k",
                "ns",
                "u",
                "1",
                GA,
                deleting=True,
                spec_modules=frozenset({"application-connector"}),
            ),
            True,
            errors.KymaDeleting,
        ),
        (KymaView("k", "ns", "u", "1", GA), True, errors.ModuleNotEnabled),
        (KymaView("k", "ns", "u", "1", GA), False, None),
        (
            KymaView("k", "ns", "u", "1", GA, spec_modules=frozenset({"application-connector"})),
            True,
            None,
        ),
        (
            KymaView("k", "ns", "u", "1", GA, status_modules=frozenset({"application-connector"})),
            True,
            None,
        ),
        (
            KymaView("k", "ns", "u", "1", {}, spec_modules=frozenset({"application-connector"})),
            True,
            errors.KymaIncomplete,
        ),
    ],
)
def test_token_policy(kyma: KymaView | None, required: bool, error: type[Exception] | None) -> None:
    if error is None:
        assert (
            check_token_allowed(kyma, module="application-connector", module_required=required)
            is kyma
        )
    else:
        with pytest.raises(error):
            check_token_allowed(kyma, module="application-connector", module_required=required)
