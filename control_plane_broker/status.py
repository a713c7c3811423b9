"""Failure conditions on the mapping and the Warning Events that go with them.

What always holds:
- a failure sets one condition (`Registered`, `TokenIssued`, `Unregistered`, `LabelsSynced`) to
  `False` with a CamelCase reason from the error's problem type, `observedGeneration` of the
  mapping, and `lastTransitionTime` moved only when the status flips (cert-manager style);
- the mapping is written only when the condition differs from what it holds, and a Warning Event
  is emitted only when the status or the reason is new: a failure that repeats writes nothing;
- best effort: a status or Event that cannot be written never changes the caller's outcome;
- messages come from the broker's own error texts, which never hold a token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from control_plane_broker.errors import BrokerError, TemporaryError
from control_plane_broker.kube.client import KubeError
from control_plane_broker.kube.events import EventRecorder
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.registration import state
from control_plane_broker.registration.state import Mapping

log = logging.getLogger(__name__)

MAX_MESSAGE = 300


def failure_text(exc: BaseException) -> tuple[str, str]:
    """(reason, message) for a condition. Temporary failures get their fixed title, so retries
    that fail with a slightly different detail do not rewrite the mapping; permanent ones keep
    the detail (e.g. Director's refusal), which is the same on every attempt."""
    if isinstance(exc, BrokerError):
        reason = state.failure_reason(exc.slug)
        if isinstance(exc, TemporaryError):
            return reason, f"{exc.title}; will retry"
        return reason, f"{exc.title}: {str(exc)[:MAX_MESSAGE]}"
    if isinstance(exc, KubeError):
        return "ControlPlaneUnavailable", "The control plane API server failed; will retry"
    return "Failed", type(exc).__name__


class StatusRecorder:
    def __init__(
        self, *, repo: MappingRepository, events: EventRecorder, clock: Callable[[], float]
    ) -> None:
        self._repo = repo
        self._events = events
        self._clock = clock

    async def failed(
        self,
        *,
        kyma_name: str,
        kyma_uid: str,
        condition: str,
        event_reason: str,
        exc: BaseException,
        mapping: Mapping | None = None,
        what: str = "",
    ) -> bool:
        """Records a failure; returns whether a Warning Event was emitted. `mapping` saves a read
        when the caller has a fresh one."""
        reason, message = failure_text(exc)
        if what:
            message = f"{what}: {message}"
        try:
            current = mapping if mapping is not None else await self._repo.get(kyma_name)
            if current is None:
                return False  # nothing to hang a condition on (and nothing registered yet)
            before = state.conditions_of(current)
            after = state.set_condition(
                before,
                type_=condition,
                status=False,
                reason=reason,
                message=message,
                now=self._clock(),
                observed_generation=state.generation_of(current),
            )
            write, tell = state.condition_changed(before, after, condition)
            if write:
                await self._repo.patch_status(kyma_name, {"conditions": after})
        except KubeError as exc_kube:
            log.warning(
                "could not write a failure condition",
                extra={"kyma": kyma_name, "condition": condition, "error": str(exc_kube)},
            )
            return False
        if tell:
            await self._events.record(
                kyma_name=kyma_name,
                kyma_uid=kyma_uid,
                reason=event_reason,
                message=message,
                warning=True,
            )
        return tell
