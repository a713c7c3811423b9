"""Fault injection: what can go wrong, as data, and the decisions drawn from it.

`Faults` is an immutable description, settable at start (CLI flags / `SimConfig`),
at run time (`PUT /_sim/faults`) and from Python (`CompassSimulator.set_faults`).
`FaultState` holds the current `Faults` plus the little mutable state the decisions
need (remaining counts, the rate-limit bucket) and answers, for one request:

1. `admit(endpoint, operations)`: is the request refused before it is executed?
   Checked in this order: `down` (503 or dropped connection), `rate_limit` (429 with
   Retry-After), then injected errors that carry an `http_status`.
2. `delay(endpoint)`: how long to wait before executing (`latency`).
3. `injected_error(operation)`: a GraphQL error to return instead of executing the
   operation (injected errors without `http_status`), once the caller passed the
   authentication, tenant and scope checks.
4. `take_lost_response(operation)`: after executing, drop the response (504 or a
   closed connection) although the operation took effect.

Three faults of Director's database, each answered with HTTP 200 as the real Director
answers them (`director.py` words the errors):

- `database_down`: every Director operation fails without effect. `database_answer`
  says how, in turn per operation (round-robin from the first answer whenever faults
  are set): code 10 without a reason, code 10 `driver: bad connection`, and for
  `registerRuntime` / `setRuntimeLabel` also code 26 (a label's tenant check failed).
- `commit_then_error` (Director mutations): `take_commit_error(operation)` after the
  operation took effect: PostgreSQL committed, the driver lost the answer, and Director
  answers code 10 `while committing transaction: ...` instead of the data.
- `field_error_after_commit` (operations answering a Runtime): `take_field_error`,
  asked by the `labels` field, which Director resolves in a transaction of its own
  after the operation: the answer carries the runtime, `labels` null and a code-10
  error at `[<field>, "labels"]`.

Counted faults (`remaining`, `lost_responses`) are consumed as they fire, and
`get()` shows what is left. Randomness and the clock are injected.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import ErrorCode
from .operations import ALL_ENDPOINTS, ALL_OPERATIONS, DIRECTOR_MUTATIONS, Endpoint

__all__ = [
    "RUNTIME_ANSWERS",
    "AfterCommit",
    "DatabaseAnswer",
    "DownMode",
    "FaultState",
    "Faults",
    "InjectedError",
    "Latency",
    "LostResponseMode",
    "RateLimit",
    "Refusal",
]


class DownMode(StrEnum):
    """How "Compass is down" looks to a client."""

    REFUSE = "refuse"  # the listener is closed: connection refused
    DROP = "drop"  # connections are accepted and closed without a response
    UNAVAILABLE = "503"  # HTTP 503 Service Unavailable


class LostResponseMode(StrEnum):
    GATEWAY_TIMEOUT = "504"  # the gateway answers 504 after the operation took effect
    DROP = "drop"  # the connection is closed after the operation took effect


class DatabaseAnswer(StrEnum):
    """What Director answers a call while its database is gone (all HTTP 200, no effect)."""

    # A typed internal error (e.g. MapSQLError): code 10 `Internal Server Error [errorID=…]`.
    INTERNAL = "internal"
    # The transaction could not begin: code 10 with the reason `input: <field> driver: bad
    # connection` (a plain error, so the presenter shows it).
    BAD_CONNECTION = "bad_connection"
    # Creating a label, the check of the caller's access to its runtime failed: code 26
    # `Unauthorized [reason=Tenant <internal ID> does not have access to the parent of the
    # currently created runtimeLabel: while checking for tenant access: ...]`.
    TENANT_ACCESS = "tenant_access"


# The answers each operation takes in turn while `database_down`: the calls that create
# labels (registerRuntime, setRuntimeLabel) can also fail in the label's tenant check.
_DATABASE_ANSWERS = (DatabaseAnswer.INTERNAL, DatabaseAnswer.BAD_CONNECTION)
_LABEL_WRITING_ANSWERS = (*_DATABASE_ANSWERS, DatabaseAnswer.TENANT_ACCESS)
_LABEL_WRITERS = frozenset({"registerRuntime", "setRuntimeLabel"})

# Operations whose answer is a Runtime: Director resolves its `labels` field in a
# transaction of its own, after the operation's.
RUNTIME_ANSWERS: frozenset[str] = frozenset(
    {"registerRuntime", "updateRuntime", "unregisterRuntime", "runtime", "runtimes"}
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_operation(name: str) -> str:
    if name != "*" and name not in ALL_OPERATIONS:
        raise ValueError(f"unknown operation {name!r}; known: {sorted(ALL_OPERATIONS)} or '*'")
    return name


class Latency(_Model):
    """Each request waits `fixed_seconds` plus a uniform random share of `jitter_seconds`."""

    fixed_seconds: float = Field(default=0.0, ge=0)
    jitter_seconds: float = Field(default=0.0, ge=0)
    endpoints: frozenset[Endpoint] = ALL_ENDPOINTS


class RateLimit(_Model):
    """A token bucket: `burst` requests at once, refilled at `requests_per_second`."""

    requests_per_second: float = Field(gt=0)
    burst: int = Field(default=1, ge=1)
    # None: the time until the bucket holds a token again, rounded up (at least 1 s).
    retry_after_seconds: int | None = Field(default=None, ge=0)
    endpoints: frozenset[Endpoint] = ALL_ENDPOINTS


class InjectedError(_Model):
    """Fail calls of `operation` ("*" = every operation) with probability `rate`.

    Without `http_status` the call gets a GraphQL error with `error_code` (for the
    OAuth endpoint: HTTP 500 `server_error`); with `http_status` the whole HTTP
    request is answered with that status before anything is executed.
    `remaining` limits how many calls fail (None: no limit).
    """

    operation: str = "*"
    error_code: ErrorCode = ErrorCode.INTERNAL_ERROR
    http_status: int | None = Field(default=None, ge=400, le=599)
    rate: float = Field(default=1.0, ge=0, le=1)
    remaining: int | None = Field(default=None, ge=1)
    message: str | None = None

    @field_validator("operation")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return _check_operation(value)


class AfterCommit(_Model):
    """A fault that strikes after an operation took effect: it fires with probability
    `rate`, at most `remaining` times (None: no limit). In a `Faults` document a plain
    count N stands for `{"remaining": N}` (0: no fault)."""

    rate: float = Field(default=1.0, ge=0, le=1)
    remaining: int | None = Field(default=None, ge=1)


def _after_commit_map(value: object) -> object:
    """Counts written as plain numbers become `AfterCommit(remaining=N)`; 0 drops the entry."""
    if not isinstance(value, dict):
        return value
    out: dict[object, object] = {}
    for name, fault in value.items():
        if type(fault) is int:
            if fault < 0:
                raise ValueError(f"{name!r}: a count must be >= 0")
            if fault > 0:
                out[name] = AfterCommit(remaining=fault)
        else:
            out[name] = fault
    return out


def _check_operations(value: dict[str, AfterCommit], allowed: frozenset[str], what: str) -> None:
    for name in value:
        if name not in allowed:
            raise ValueError(f"{name!r} is not {what}; known: {sorted(allowed)}")


class Faults(_Model):
    down: DownMode | None = None
    # Retry-After sent with 503 while `down` is "503" (None: no header).
    down_retry_after_seconds: int | None = Field(default=None, ge=0)
    latency: Latency | None = None
    errors: tuple[InjectedError, ...] = ()
    # operation -> how many of its next calls lose their response after taking effect.
    lost_responses: dict[str, int] = Field(default_factory=dict)
    lost_response_mode: LostResponseMode = LostResponseMode.GATEWAY_TIMEOUT
    rate_limit: RateLimit | None = None
    # Director requests beyond this many wait for a free slot (None: no limit).
    max_concurrent_director_requests: int | None = Field(default=None, ge=1)
    # Director's database is gone: every Director operation fails without effect.
    database_down: bool = False
    # Director mutation -> its calls take effect, then answer code 10 (failed commit).
    commit_then_error: dict[str, AfterCommit] = Field(default_factory=dict)
    # Operation answering a Runtime -> its calls take effect, then `labels` fails.
    field_error_after_commit: dict[str, AfterCommit] = Field(default_factory=dict)

    @field_validator("commit_then_error", "field_error_after_commit", mode="before")
    @classmethod
    def _counts(cls, value: object) -> object:
        return _after_commit_map(value)

    @field_validator("commit_then_error")
    @classmethod
    def _check_commit(cls, value: dict[str, AfterCommit]) -> dict[str, AfterCommit]:
        _check_operations(value, DIRECTOR_MUTATIONS, "a Director mutation")
        return value

    @field_validator("field_error_after_commit")
    @classmethod
    def _check_field(cls, value: dict[str, AfterCommit]) -> dict[str, AfterCommit]:
        _check_operations(value, RUNTIME_ANSWERS, "an operation answering a Runtime")
        return value

    @field_validator("lost_responses")
    @classmethod
    def _check_lost(cls, value: dict[str, int]) -> dict[str, int]:
        for name, count in value.items():
            _check_operation(name)
            if count < 0:
                raise ValueError(f"lost_responses[{name!r}] must be >= 0")
        return {name: count for name, count in value.items() if count > 0}


@dataclass(frozen=True)
class Refusal:
    """The request is answered (or dropped) without being executed."""

    kind: Literal["unavailable", "dropped", "rate_limited", "injected_error"]
    http_status: int | None  # None: the connection is closed without a response
    retry_after_seconds: int | None = None
    operation: str | None = None  # for injected errors: the operation that fired


class FaultState:
    """Current faults plus their consumable state; safe to use from any thread."""

    def __init__(
        self,
        faults: Faults,
        *,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self._lock = threading.Lock()
        self._rng = rng
        self._clock = clock
        self._faults = faults
        self._bucket_tokens = 0.0
        self._bucket_time = 0.0
        # operation -> how many calls `database_answer` answered since the faults were set.
        self._database_turns: dict[str, int] = {}
        self._reset_bucket()

    def get(self) -> Faults:
        with self._lock:
            return self._faults

    def replace(self, faults: Faults) -> None:
        with self._lock:
            self._faults = faults
            self._database_turns.clear()
            self._reset_bucket()

    def _reset_bucket(self) -> None:
        limit = self._faults.rate_limit
        self._bucket_tokens = float(limit.burst) if limit else 0.0
        self._bucket_time = self._clock()

    def admit(self, endpoint: Endpoint, operations: Sequence[str]) -> Refusal | None:
        with self._lock:
            faults = self._faults
            if faults.down is DownMode.UNAVAILABLE:
                return Refusal("unavailable", 503, faults.down_retry_after_seconds)
            if faults.down is not None:
                # REFUSE closes the listener; a request that slipped in is dropped.
                return Refusal("dropped", None)
            limit = faults.rate_limit
            if limit is not None and endpoint in limit.endpoints:
                refusal = self._take_bucket_token(limit)
                if refusal is not None:
                    return refusal
            for operation in operations:
                fired = self._fire(operation, http=True)
                if fired is not None:
                    assert fired.http_status is not None
                    return Refusal("injected_error", fired.http_status, operation=operation)
            return None

    def _take_bucket_token(self, limit: RateLimit) -> Refusal | None:
        now = self._clock()
        elapsed = max(0.0, now - self._bucket_time)
        self._bucket_time = now
        self._bucket_tokens = min(
            float(limit.burst), self._bucket_tokens + elapsed * limit.requests_per_second
        )
        if self._bucket_tokens >= 1.0:
            self._bucket_tokens -= 1.0
            return None
        retry_after = limit.retry_after_seconds
        if retry_after is None:
            retry_after = max(1, math.ceil((1.0 - self._bucket_tokens) / limit.requests_per_second))
        return Refusal("rate_limited", 429, retry_after)

    def delay(self, endpoint: Endpoint) -> float:
        with self._lock:
            latency = self._faults.latency
            if latency is None or endpoint not in latency.endpoints:
                return 0.0
            jitter = self._rng.uniform(0.0, latency.jitter_seconds) if latency.jitter_seconds else 0
            return latency.fixed_seconds + jitter

    def injected_error(self, operation: str) -> InjectedError | None:
        with self._lock:
            return self._fire(operation, http=False)

    def take_lost_response(self, operation: str) -> LostResponseMode | None:
        with self._lock:
            remaining = self._faults.lost_responses.get(operation, 0)
            if remaining <= 0:
                return None
            lost = dict(self._faults.lost_responses)
            lost[operation] = remaining - 1
            self._faults = self._faults.model_copy(
                update={"lost_responses": {k: v for k, v in lost.items() if v > 0}}
            )
            return self._faults.lost_response_mode

    def database_answer(self, operation: str) -> DatabaseAnswer | None:
        """While `database_down`: how this call of a Director operation fails, in turn."""
        with self._lock:
            if not self._faults.database_down:
                return None
            answers = _LABEL_WRITING_ANSWERS if operation in _LABEL_WRITERS else _DATABASE_ANSWERS
            turn = self._database_turns.get(operation, 0)
            self._database_turns[operation] = turn + 1
            return answers[turn % len(answers)]

    def take_commit_error(self, operation: str) -> bool:
        """Whether this call, which took effect, answers with a failed commit instead."""
        with self._lock:
            return self._take_after_commit("commit_then_error", operation)

    def take_field_error(self, operation: str) -> bool:
        """Whether the `labels` field of this call's Runtime fails (its own transaction)."""
        with self._lock:
            return self._take_after_commit("field_error_after_commit", operation)

    def _take_after_commit(
        self, name: Literal["commit_then_error", "field_error_after_commit"], operation: str
    ) -> bool:
        faults: dict[str, AfterCommit] = getattr(self._faults, name)
        fault = faults.get(operation)
        if fault is None:
            return False
        # Only draw a random number when it matters, so rate=1 stays deterministic.
        if fault.rate < 1.0 and self._rng.random() >= fault.rate:
            return False
        if fault.remaining is not None:
            rest = dict(faults)
            if fault.remaining == 1:
                del rest[operation]
            else:
                rest[operation] = fault.model_copy(update={"remaining": fault.remaining - 1})
            self._faults = self._faults.model_copy(update={name: rest})
        return True

    def _fire(self, operation: str, *, http: bool) -> InjectedError | None:
        """The first matching injected error that fires, consuming one of its uses."""
        errors = self._faults.errors
        for index, error in enumerate(errors):
            if (error.http_status is not None) != http:
                continue
            if error.operation not in ("*", operation):
                continue
            # Only draw a random number when it matters, so rate=1 stays deterministic.
            if error.rate < 1.0 and self._rng.random() >= error.rate:
                continue
            if error.remaining is not None:
                rest = list(errors)
                if error.remaining == 1:
                    del rest[index]
                else:
                    rest[index] = error.model_copy(update={"remaining": error.remaining - 1})
                self._faults = self._faults.model_copy(update={"errors": tuple(rest)})
            return error
        return None
