"""Events about a Kyma in KCP (registration, token issue, unregistration, failures).

A thin adapter over `kubeapi.EventRecorder`, which aggregates repeats (count + lastTimestamp)
and never raises. Messages are written by the broker itself and never contain tokens; control
and bidi characters are dropped from them (`text.for_humans`).
"""

from __future__ import annotations

import logging

from control_plane_broker.kyma import KYMA_GROUP, KYMA_VERSION
from control_plane_broker.overload.deferred_writes import DeferredWrites
from control_plane_broker.text import for_humans
from kubeapi import EventRecorder, ObjectRef

log = logging.getLogger(__name__)

MAX_PENDING = 1024  # Events in flight in the background; beyond that they are dropped (logged)


def _never_busy() -> bool:
    return False


class KymaEvents:
    def __init__(
        self,
        recorder: EventRecorder,
        *,
        namespace: str,
        deferred: DeferredWrites | None = None,
    ) -> None:
        """`deferred`: where emitted Events wait while Director is busy (default: none wait,
        each is written at once in the background, at most `MAX_PENDING` at a time)."""
        self._recorder = recorder
        self._namespace = namespace
        self._deferred = deferred or DeferredWrites(
            busy=_never_busy, max_pending=0, max_started=MAX_PENDING
        )

    def emit(
        self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """Records an Event in the background: an answer never waits for its Event."""

        async def write() -> None:
            await self.record(
                kyma_name=kyma_name,
                kyma_uid=kyma_uid,
                reason=reason,
                message=message,
                warning=warning,
            )

        if not self._deferred.defer(write):
            log.warning("event dropped: too many waiting", extra={"reason": reason})

    async def drain(self) -> None:
        """Writes the Events still waiting or in flight (at shutdown)."""
        await self._deferred.drain()

    async def record(
        self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        await self._recorder.record(
            ObjectRef(
                api_version=f"{KYMA_GROUP}/{KYMA_VERSION}",
                kind="Kyma",
                name=kyma_name,
                namespace=self._namespace,
                uid=kyma_uid or None,
            ),
            type_="Warning" if warning else "Normal",
            reason=reason,
            # Messages quote runtimes' own text (a report's error, an issuer): whatever a
            # caller sent, no control or bidi character reaches an operator's terminal.
            message=for_humans(message),
        )
