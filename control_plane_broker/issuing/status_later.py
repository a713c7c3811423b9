"""The token path's writes on the mapping's status that no answer waits for: once a token is
issued, or Director failed, the status is written after the answer (`overload/deferred_writes`),
or, without a taker for later work, before it.

Holds: a write the deferred writes cannot take is logged, never awaited in the request (a status
write under load can take seconds, and while requests wait for Director they must not share the
broker and the KCP API server with bookkeeping).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from control_plane_broker.kyma import KymaView
from control_plane_broker.reconciler.mapping_status import StatusRecorder

# The token path's logger: these lines were the token issuer's before it had a package.
log = logging.getLogger("control_plane_broker.issuing")

# Takes a write to run later (`DeferredWrites.defer`); False when it could not take it.
AfterAnswer = Callable[[Callable[[], Awaitable[object]]], bool]


class StatusLater:
    def __init__(self, status: StatusRecorder, *, after_answer: AfterAnswer | None) -> None:
        """`after_answer`: takes the writes to run later (default: they are awaited)."""
        self._status = status
        self._after_answer = after_answer

    async def run(self, write: Callable[[], Awaitable[object]], *, kyma: KymaView) -> None:
        if self._after_answer is None:
            await write()
            return
        if not self._after_answer(write):
            log.error(
                "mapping status not written: too many writes waiting", extra={"kyma": kyma.name}
            )

    async def failed(
        self,
        kyma: KymaView,
        condition: str,
        event_reason: str,
        exc: BaseException,
        *,
        director_labels: dict[str, str] | None = None,
    ) -> None:
        """The failure `exc` on the mapping's `condition`, with a Warning Event."""
        await self.run(
            functools.partial(
                self._status.failed,
                kyma=kyma,
                condition=condition,
                event_reason=event_reason,
                exc=exc,
                director_labels=director_labels,
            ),
            kyma=kyma,
        )
