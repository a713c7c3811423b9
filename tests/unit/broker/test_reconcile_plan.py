"""The reconciler's pure plan (`reconciler.plan`)."""

from __future__ import annotations

import dataclasses

import pytest

from control_plane_broker.kyma import KymaView
from control_plane_broker.reconciler.kyma_reconciler import (
    Nothing,
    Release,
    Requeue,
    SyncLabels,
    Unregister,
    plan,
)
from control_plane_broker.registration import state
from tests.unit.broker.mapping_views import mapping_view as _mapping

GA = {"kyma-project.io/global-account-id": "ga"}
_AC = frozenset({"application-connector"})


@pytest.mark.parametrize(
    ("mapping", "kyma", "disabled", "expected"),
    [
        (_mapping(compass_id="c"), None, "keep", Unregister("kyma-deleted")),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA, deleting=True, spec_modules=_AC),
            "keep",
            Unregister("kyma-deleted"),
        ),
        # A mapping deleted while its Kyma lives is let go; the runtime stays in Compass.
        (
            _mapping(compass_id="c", deleting=True),
            KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC),
            "keep",
            Release(),
        ),
        (
            _mapping(compass_id="c", deleting=True),
            KymaView("rt-1", "n", "u", "1", GA, deleting=True, spec_modules=_AC),
            "keep",
            Unregister("kyma-deleted"),
        ),
        # Dropping a runtime from Compass is an explicit operator action.
        (
            dataclasses.replace(_mapping(compass_id="c"), unregister="moved to another landscape"),
            KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC),
            "keep",
            Unregister("operator"),
        ),
        (_mapping(holder="x", expires=200), None, "keep", Requeue(after=100.5)),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA),
            "unregister",
            Unregister("module-disabled"),
        ),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA),
            "keep",
            SyncLabels({"k": "v"}, {"k": "v"}),
        ),
        (_mapping(), KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC), "keep", Nothing()),
        # A revoked runtime unregistered while its Kyma lives is held by its mapping: with no
        # runtime recorded there is nothing to unregister again, until the Kyma goes.
        (
            dataclasses.replace(_mapping(), revoked="leaked credentials"),
            KymaView("rt-1", "n", "u", "1", GA),
            "unregister",
            Nothing(),
        ),
        (
            dataclasses.replace(_mapping(compass_id="c"), revoked="leaked credentials"),
            KymaView("rt-1", "n", "u", "1", GA),
            "unregister",
            Unregister("module-disabled"),
        ),
        (dataclasses.replace(_mapping(), revoked=""), None, "keep", Unregister("kyma-deleted")),
    ],
)
def test_reconcile_plan(
    mapping: state.Mapping, kyma: KymaView | None, disabled: str, expected: object
) -> None:
    got = plan(
        mapping,
        kyma,
        now=100.0,
        module="application-connector",
        module_required=True,
        disabled_policy=disabled,
        desired_labels={"k": "v"} if kyma else None,
    )
    assert got == expected
