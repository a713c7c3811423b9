"""A watch-fed mapping view for unit tests: runtime `rt-1` in global account `ga`."""

from __future__ import annotations

from control_plane_broker.registration import state


def mapping_view(
    *,
    compass_id: str | None = None,
    holder: str | None = None,
    expires: float | None = None,
    deleting: bool = False,
) -> state.Mapping:
    return state.Mapping(
        name="rt-1",
        resource_version="7",
        compass_id=compass_id,
        claim_holder=holder,
        claim_expires=expires,
        deleting=deleting,
        finalizers=(state.FINALIZER,),
        director_labels={},
        tenant="ga",
        runtime_id="RT-1",
        shoot="c-1",
        document=b'{"metadata": {"name": "rt-1", "resourceVersion": "7"}}',
    )
