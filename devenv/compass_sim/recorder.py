"""Counters per operation and a bounded request log.

One `RequestRecord` per operation per HTTP request (a GraphQL request with two
root fields gives two records), written when the request is answered or dropped.
Records hold the operation name, tenant, outcome, HTTP status and error codes:
never tokens, secrets or certificates.

`OperationCounter` for an operation:
- `attempts`: every call that reached the simulator, whatever happened to it;
- `successes`: calls executed without error (including those whose response was
  then lost on purpose: the effect happened);
- `errors`: calls answered with an error (GraphQL error or HTTP error status),
  including injected ones; `injected_errors`, `lost_responses`, `rate_limited` and
  `unavailable` (503 or dropped while down) count those cases separately.

Director's database faults: a call refused while `database_down` is an injected
error (nothing happened); a call that took effect and was then answered with a
database error (`commit_then_error`, `field_error_after_commit`) has the outcome
`error_after_commit` and counts among `errors` (its answer was one).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from .operations import Endpoint

__all__ = ["OperationCounter", "Outcome", "Recorder", "RequestRecord"]


class Outcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    INJECTED_ERROR = "injected_error"
    LOST_RESPONSE = "lost_response"
    ERROR_AFTER_COMMIT = "error_after_commit"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    DROPPED = "dropped"


class OperationCounter(BaseModel):
    attempts: int = 0
    successes: int = 0
    errors: int = 0
    injected_errors: int = 0
    lost_responses: int = 0
    rate_limited: int = 0
    unavailable: int = 0


class RequestRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq: int
    at: datetime
    endpoint: Endpoint
    operation: str
    tenant: str | None
    outcome: Outcome
    http_status: int | None  # None: the connection was closed without a response
    error_codes: tuple[int, ...] = ()
    duration_seconds: float


class Recorder:
    def __init__(self, *, log_size: int) -> None:
        self._lock = threading.Lock()
        self._log: deque[RequestRecord] = deque(maxlen=log_size)
        self._counters: dict[str, OperationCounter] = {}
        self._seq = 0

    def record(
        self,
        *,
        at: datetime,
        endpoint: Endpoint,
        operation: str,
        tenant: str | None,
        outcome: Outcome,
        http_status: int | None,
        error_codes: Iterable[int] = (),
        duration_seconds: float,
    ) -> RequestRecord:
        codes = tuple(error_codes)
        with self._lock:
            self._seq += 1
            record = RequestRecord(
                seq=self._seq,
                at=at,
                endpoint=endpoint,
                operation=operation,
                tenant=tenant,
                outcome=outcome,
                http_status=http_status,
                error_codes=codes,
                duration_seconds=duration_seconds,
            )
            self._log.append(record)
            counter = self._counters.setdefault(operation, OperationCounter())
            counter.attempts += 1
            failed = bool(codes) or outcome not in (Outcome.OK, Outcome.LOST_RESPONSE)
            if failed:
                counter.errors += 1
            else:
                counter.successes += 1
            if outcome is Outcome.INJECTED_ERROR:
                counter.injected_errors += 1
            elif outcome is Outcome.LOST_RESPONSE:
                counter.lost_responses += 1
            elif outcome is Outcome.RATE_LIMITED:
                counter.rate_limited += 1
            elif outcome in (Outcome.UNAVAILABLE, Outcome.DROPPED):
                counter.unavailable += 1
            return record

    def counters(self) -> dict[str, OperationCounter]:
        with self._lock:
            return {name: c.model_copy() for name, c in self._counters.items()}

    def requests(
        self,
        *,
        operation: str | None = None,
        tenant: str | None = None,
        outcome: Outcome | None = None,
        since_seq: int = 0,
    ) -> list[RequestRecord]:
        with self._lock:
            records = list(self._log)
        return [
            r
            for r in records
            if r.seq > since_seq
            and (operation is None or r.operation == operation)
            and (tenant is None or r.tenant == tenant)
            and (outcome is None or r.outcome is outcome)
        ]

    def clear(self) -> None:
        with self._lock:
            self._log.clear()
            self._counters.clear()
