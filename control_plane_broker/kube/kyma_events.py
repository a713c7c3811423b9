"""Events about a Kyma in KCP (registration, token issue, unregistration, failures).

A thin adapter over `kubeapi.EventRecorder`, which aggregates repeats (count + lastTimestamp)
and never raises. Messages are written by the broker itself and never contain tokens; control
and bidi characters are dropped from them (`text.for_humans`).
"""

from __future__ import annotations

import asyncio
import logging

from control_plane_broker.kyma import KYMA_GROUP, KYMA_VERSION
from control_plane_broker.text import for_humans
from kubeapi import EventRecorder, ObjectRef

log = logging.getLogger(__name__)

MAX_PENDING = 1024  # Events in flight in the background; beyond that they are dropped (logged)


class KymaEvents:
    def __init__(self, recorder: EventRecorder, *, namespace: str) -> None:
        self._recorder = recorder
        self._namespace = namespace
        self._pending: set[asyncio.Task[None]] = set()

    def emit(
        self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """Records an Event in the background: an answer never waits for its Event."""
        if len(self._pending) >= MAX_PENDING:
            log.warning("event dropped: too many in flight", extra={"reason": reason})
            return
        task = asyncio.create_task(
            self.record(
                kyma_name=kyma_name,
                kyma_uid=kyma_uid,
                reason=reason,
                message=message,
                warning=warning,
            )
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self) -> None:
        """Waits for the Events still in flight (at shutdown)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

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
