"""The mapping's status and the Events that go with it, the broker's only writer of a mapping's
status: the conditions of registration, token, unregistration and label sync failures, the
status after a token was issued or Director's labels synced, and the conflict-safe write of a
computed change with its Warning Events (what connection reports and the leader's connection
checks decide, `connections/report_rules.Change`). Not one feature's: the token path, the
reconciler and connection reports write through it.

What always holds:
- the status is written only when it would change (read from the watch-fed mapping view), with
  the resourceVersion it was computed from, so two replicas never overwrite each other's
  conditions (a conflict re-reads and recomputes once; the next change writes again anyway);
- `lastTokenIssuedAt` is refreshed at most every `TOKEN_TIMESTAMP_REFRESH` seconds: a timestamp
  per token would cost one KCP write per token, the count is in the aggregated Event;
- a failure sets one condition (`Registered`, `TokenIssued`, `Unregistered`, `LabelsSynced`) to
  `False` with a CamelCase reason from the error's problem type, `observedGeneration` of the
  mapping, and `lastTransitionTime` moved only when the status flips (cert-manager style); a
  Warning Event is emitted only when the status or the reason is new;
- best effort: a status or Event that cannot be written never changes the caller's outcome,
  but for a connection report's and the label sync's write (raised: the agent or the reconciler
  tries again);
- messages come from the broker's own error texts, which never hold a token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from control_plane_broker.connections.report_rules import Change
from control_plane_broker.errors import BrokerError, TemporaryError
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kyma import KymaView
from control_plane_broker.registration import state
from control_plane_broker.registration.service import MappingReader, Registered
from control_plane_broker.registration.state import Mapping
from control_plane_broker.text import for_humans
from kubeapi import Conflict, KubeError

# The name it logged under before it moved into its package: log lines stay as they were.
log = logging.getLogger("control_plane_broker.mapping_status")

MAX_MESSAGE = 300
TOKEN_TIMESTAMP_REFRESH = 600.0
CHANGE_ROUNDS = 4  # conflicts in a row before a status write gives up (a report: retried)


def failure_text(exc: BaseException) -> tuple[str, str]:
    """(reason, message) for a condition. Temporary failures get their fixed title, so retries
    that fail with a slightly different detail do not rewrite the mapping; permanent ones keep
    the detail (e.g. Director's refusal), which is the same on every attempt."""
    if isinstance(exc, BrokerError):
        reason = state.failure_reason(exc.slug)
        if isinstance(exc, TemporaryError):
            return reason, f"{exc.title}; will retry"
        # Permanent failures carry Director's own words: free text from outside.
        return reason, f"{exc.title}: {for_humans(str(exc)[:MAX_MESSAGE])}"
    if isinstance(exc, KubeError):
        return "ControlPlaneUnavailable", "The control plane API server failed; will retry"
    return "Failed", type(exc).__name__


def issued_status(mapping: Mapping, *, registered: Registered, now: float) -> dict[str, Any] | None:
    """The status after a token was issued, or None when what is there already says so."""
    before = dict(mapping.raw.get("status") or {})
    conditions = state.conditions_of(mapping)
    for condition in (
        state.Condition(
            "Registered", True, "RuntimeRegistered", f"Compass runtime {registered.compass_id}"
        ),
        state.Condition(
            "TokenIssued", True, "TokenIssued", "a one-time token was handed to the runtime agent"
        ),
    ):
        conditions = state.with_condition(
            conditions, condition, now=now, generation=state.generation_of(mapping)
        ).conditions
    after = {**before, "registered": True, "configured": True, "state": "Ready"}
    after["conditions"] = conditions
    if before.get("compassRefusal") is not None:
        after["compassRefusal"] = None  # Director knows the tenants now: the merge removes it
    if registered.labels is not None:
        after["directorLabels"] = registered.labels
    last = state.from_rfc3339(before.get("lastTokenIssuedAt"))
    stale = last is None or now - last >= TOKEN_TIMESTAMP_REFRESH
    if after == before and not stale:
        return None
    after["lastTokenIssuedAt"] = state.to_rfc3339(now) if stale else before["lastTokenIssuedAt"]
    return after


def failed_status(
    mapping: Mapping,
    *,
    condition: str,
    reason: str,
    message: str,
    now: float,
    director_labels: dict[str, str] | None,
    refusal: state.TenantRefusal | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """(the status to write or None, whether the failure is news worth an Event)."""
    failure = state.with_condition(
        state.conditions_of(mapping),
        state.Condition(condition, False, reason, message),
        now=now,
        generation=state.generation_of(mapping),
    )
    status: dict[str, Any] = {}
    if failure.changed:
        status["conditions"] = failure.conditions
    if director_labels is not None and director_labels != mapping.director_labels:
        status["directorLabels"] = director_labels
    if refusal is not None and refusal != mapping.tenant_refusal:
        status["compassRefusal"] = refusal.to_status()
    return (status or None), failure.news


def labels_synced_status(
    mapping: Mapping, *, written: int, desired: dict[str, str], now: float
) -> dict[str, Any]:
    """The status after the leader wrote `written` Director labels: `desired` recorded and
    `LabelsSynced` true."""
    synced = state.with_condition(
        state.conditions_of(mapping),
        state.Condition(
            "LabelsSynced", True, "LabelsSynced", f"{written} Director label(s) written"
        ),
        now=now,
        generation=state.generation_of(mapping),
    )
    return {"directorLabels": desired, "conditions": synced.conditions}


class StatusRecorder:
    def __init__(
        self,
        *,
        repo: MappingRepository,
        cache: MappingReader,
        events: KymaEvents,
        clock: Callable[[], float],
    ) -> None:
        self._repo = repo
        self._cache = cache
        self._events = events
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    async def runtime_lost(self, *, kyma: KymaView, compass_id: str) -> None:
        """Tells the operator that the recorded Compass runtime is gone from Director."""
        await self._events.record(
            kyma_name=kyma.name,
            kyma_uid=kyma.uid,
            reason="CompassRuntimeLost",
            message=f"Compass runtime {compass_id} no longer exists in Director (unregistered "
            "outside the broker); the runtime is registered again",
            warning=True,
        )

    async def _current(self, name: str, given: Mapping | None) -> Mapping | None:
        if given is not None:
            return given
        return self._cache.get(name) or await self._repo.get(name)

    async def _write(
        self, name: str, mapping: Mapping, compute: Callable[[Mapping], dict[str, Any] | None]
    ) -> None:
        current: Mapping | None = mapping
        for _ in range(CHANGE_ROUNDS):
            if current is None:
                return
            status = compute(current)
            if status is None:
                return
            try:
                await self._repo.patch_status(
                    name, status, resource_version=current.resource_version
                )
                return
            except Conflict:
                current = await self._repo.get(name)

    async def apply_change(
        self,
        mapping: Mapping,
        compute: Callable[[Mapping], Change | None],
        *,
        kyma_uid: str = "",
    ) -> bool:
        """Writes what `compute` decides, starting from `mapping` (the watch-fed view) and, after
        a conflict, from the current object: another replica's write is never overwritten and
        never lost, the change is recomputed on top of it. Returns whether anything was written
        (and emits its Events); raises `KubeError`, `Conflict` after `CHANGE_ROUNDS` in a row."""
        current: Mapping | None = mapping
        for _ in range(CHANGE_ROUNDS):
            if current is None:
                return False
            change = compute(current)
            if change is None:
                return False
            try:
                await self._repo.patch_status(
                    current.name, change.status, resource_version=current.resource_version
                )
            except Conflict:
                current = await self._repo.get(mapping.name)
                continue
            for event in change.events:
                self._events.emit(
                    kyma_name=mapping.name,
                    kyma_uid=kyma_uid,
                    reason=event.reason,
                    message=event.message,
                    warning=True,
                )
            return True
        raise Conflict(f"mapping {mapping.name} kept changing")

    async def labels_synced(
        self, mapping: Mapping, *, written: int, desired: dict[str, str]
    ) -> None:
        """Records Director's labels as the leader wrote them, conditional on the
        resourceVersion the labels were judged from. Not best effort, unlike the other writes:
        raises `KubeError` (`Conflict` included) so the reconciler backs off and judges again."""
        await self._repo.patch_status(
            mapping.name,
            labels_synced_status(mapping, written=written, desired=desired, now=self._clock()),
            resource_version=mapping.resource_version,
        )

    async def issued(self, *, kyma: KymaView, registered: Registered) -> None:
        now = self._clock()
        try:
            mapping = await self._current(kyma.name, registered.mapping)
            if mapping is not None:
                await self._write(
                    kyma.name, mapping, lambda m: issued_status(m, registered=registered, now=now)
                )
        except KubeError as exc:
            log.warning(
                "could not update mapping status", extra={"kyma": kyma.name, "error": str(exc)}
            )
        # One Event per token, aggregated (count + lastTimestamp) for repeats; a registration
        # says both in one, so a new runtime costs one Event write, not two.
        if registered.outcome == "registered":
            self._events.emit(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                reason="RuntimeRegistered",
                message=f"registered in Compass as runtime {registered.compass_id}; "
                "one-time token issued to the runtime agent",
            )
        else:
            self._events.emit(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                reason="TokenIssued",
                message="one-time token issued to the runtime agent",
            )

    async def failed(
        self,
        *,
        kyma: KymaView | None = None,
        name: str = "",
        condition: str,
        event_reason: str,
        exc: BaseException,
        mapping: Mapping | None = None,
        what: str = "",
        director_labels: dict[str, str] | None = None,
        refusal: state.TenantRefusal | None = None,
    ) -> bool:
        """Records a failure (and Director's refusal of the Kyma's tenants, when given);
        returns whether a Warning Event was emitted."""
        name = kyma.name if kyma is not None else name
        reason, message = failure_text(exc)
        if what:
            message = f"{what}: {message}"
        now = self._clock()
        tell = False
        try:
            current = await self._current(name, mapping)
            if current is None:
                return False  # nothing to hang a condition on (and nothing registered yet)

            def compute(m: Mapping) -> tuple[dict[str, Any] | None, bool]:
                return failed_status(
                    m,
                    condition=condition,
                    reason=reason,
                    message=message,
                    now=now,
                    director_labels=director_labels,
                    refusal=refusal,
                )

            _, tell = compute(current)
            await self._write(name, current, lambda m: compute(m)[0])
        except KubeError as exc_kube:
            log.warning(
                "could not write a failure condition",
                extra={"kyma": name, "condition": condition, "error": str(exc_kube)},
            )
            return False
        if tell:
            await self._events.record(
                kyma_name=name,
                kyma_uid=kyma.uid if kyma is not None else "",
                reason=event_reason,
                message=message,
                warning=True,
            )
        return tell
