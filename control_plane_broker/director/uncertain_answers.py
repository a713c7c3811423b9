"""Answers to writing calls that do not prove what Director wrote, counted and told to an
operator: one WARNING per burst, with the operation and the first answer's words, so a database
failing under Director shows in the log without a line per call.

Holds: pure bookkeeping on an injected clock; the message is Director's error text (no token
ever reaches it: tokens travel in headers and answers' data, never in error messages).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# A burst ends after this long without an uncertain answer; the next one warns again.
QUIET_SECONDS = 60.0
MESSAGE_CHARS = 300


class UncertainAnswers:
    def __init__(
        self,
        *,
        count: Callable[[str], None],
        clock: Callable[[], float],
        quiet_seconds: float = QUIET_SECONDS,
    ) -> None:
        """`count(operation)`: the metric, incremented once per uncertain answer."""
        self._count = count
        self._clock = clock
        self._quiet = quiet_seconds
        self._last: float | None = None

    def record(self, operation: str, message: str) -> None:
        self._count(operation)
        now = self._clock()
        quiet = self._last is None or now - self._last >= self._quiet
        self._last = now
        if quiet:
            log.warning(
                "Director answered a writing call without proving what it wrote (its database "
                "may be failing); the broker looks before it writes again",
                extra={"operation": operation, "answer": message[:MESSAGE_CHARS]},
            )
