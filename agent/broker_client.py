"""The agent's client of the control-plane broker: `POST {broker}/v1/runtimes/{id}/token` and
`POST {broker}/v1/runtimes/{id}/connection` (connection reports), with the same identity, TLS
and timeouts.

Every answer becomes one typed outcome (`agent.outcomes`), translated here and nowhere else:

    201 + token JSON                          → Issued
    2xx to a report                           → Accepted(nextReportAfterSeconds, if usable)
    401, 403, 404, 409 (and other 4xx)        → Refused(status, problem type)
    502 `compass-rejected`                    → Refused (Director refused for good)
    408, 425, 429, other 5xx, transport errors,
    garbage, no identity proof right now      → Temporary(retry_after from `Retry-After`)

(408 and 425 come from proxies and gateways in front of the broker and say "try again": taking
them for a refusal would make the agent wait the slow refusal cadence for nothing. A 502 is a
refusal only with the broker's own problem type `compass-rejected`, which its docs call
permanent: retried at the backoff's pace it cost one Director call each time for ever. A 502 of
a gateway, or the broker's `compass-failed`, stays Temporary and backs off to the cap.)

`pull()` retries Temporary outcomes forever (tenacity, with `agent.retry_policy.next_delay`: capped
exponential backoff over the failures in a row without `Retry-After`, full jitter, `Retry-After`
honoured) and returns the first Issued or Refused. A report is one request (`report()`); its
caller backs off. A 403 whose problem type ends in `runtime-revoked` is a `Refused` with
`.revoked`. Always holds: the token never appears in a log line, an exception or a repr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_never
from tenacity.wait import wait_base

from agent.credentials import Identity, IdentityError
from agent.outcomes import Accepted, Issued, Outcome, Refused, ReportOutcome, Temporary
from agent.retry_policy import RandomSource, RetryPolicy, next_delay, parse_retry_after
from kubeapi import describe_transport_error

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]
AttemptHook = Callable[[Outcome], None]

PROBLEM_JSON = "application/problem+json"
_TEMPORARY_4XX = frozenset({408, 425, 429})  # Request Timeout, Too Early, Too Many Requests
# The broker's problem types (`urn:…:broker:problem:<slug>`) that refuse for good at a 5xx status.
_PERMANENT_5XX_PROBLEMS = frozenset({"compass-rejected"})
DEFAULT_TOKEN_LIFETIME = timedelta(minutes=60)  # Compass's default for runtime tokens


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class TokenResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    token: str = Field(min_length=1, repr=False)
    connector_url: str = Field(alias="connectorURL", min_length=1)
    compass_runtime_id: str = Field(alias="compassRuntimeID", min_length=1)
    tenant: str = Field(min_length=1)
    # Director's `Timestamp` is RFC 3339; the broker passes it through, so numbers (Unix
    # seconds or milliseconds) and a missing value are tolerated too.
    expires_at: datetime | None = Field(default=None, alias="expiresAt")

    @field_validator("expires_at", mode="before")
    @classmethod
    def _lenient_time(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = value / 1000 if value > 1e11 else value
            return datetime.fromtimestamp(seconds, tz=UTC)
        if isinstance(value, str) and not value.strip():
            return None
        return value


class Problem(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str = "about:blank"
    title: str = ""
    detail: str = ""


def tls_context(
    *, ca_bundle: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
    if cert_file and key_file:
        context.load_cert_chain(str(cert_file), str(key_file))
    return context


def _problem(response: httpx.Response) -> Problem:
    try:
        return Problem.model_validate_json(response.content)
    except ValidationError:
        return Problem(title=response.reason_phrase)


def outcome_of(response: httpx.Response, *, now: datetime) -> Outcome:
    """The typed outcome of one answer to a token request (pure apart from reading the body)."""
    status = response.status_code
    if status in (200, 201):
        try:
            body = TokenResponse.model_validate_json(response.content)
        except ValidationError:
            return Temporary(reason="malformed token response", status=status)
        return Issued(
            token=body.token,
            connector_url=body.connector_url,
            compass_runtime_id=body.compass_runtime_id,
            tenant=body.tenant,
            expires_at=_aware(body.expires_at) if body.expires_at else now + DEFAULT_TOKEN_LIFETIME,
            issued_at=now,
        )
    return _not_done(response, now=now)


def report_outcome_of(response: httpx.Response, *, now: datetime) -> ReportOutcome:
    """The typed outcome of one answer to a connection report."""
    if 200 <= response.status_code < 300:
        return Accepted(next_report_after=_next_report_after(response.content))
    return _not_done(response, now=now)


def _next_report_after(content: bytes) -> float | None:
    """`nextReportAfterSeconds` when it is a positive finite number; None otherwise (the report
    landed all the same, the agent keeps its own heartbeat)."""
    try:
        document = json.loads(content)
    except (ValueError, RecursionError):
        return None
    value = document.get("nextReportAfterSeconds") if isinstance(document, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _permanent_5xx(problem: Problem) -> bool:
    return problem.type.rsplit(":", 1)[-1] in _PERMANENT_5XX_PROBLEMS


def _not_done(response: httpx.Response, *, now: datetime) -> Refused | Temporary:
    status = response.status_code
    if status >= 500 and _permanent_5xx(problem := _problem(response)):
        return Refused(status=status, reason=problem.type, detail=problem.detail)
    if status in _TEMPORARY_4XX or status >= 500:
        problem = _problem(response)
        return Temporary(
            reason=problem.type if problem.type != "about:blank" else problem.title or str(status),
            status=status,
            retry_after=parse_retry_after(response.headers.get("Retry-After"), now=now),
        )
    if 400 <= status < 500:
        problem = _problem(response)
        reason = problem.type if problem.type != "about:blank" else problem.title or str(status)
        return Refused(status=status, reason=reason, detail=problem.detail)
    return Temporary(reason=f"unexpected status {status}", status=status)


class _BackoffWait(wait_base):
    """tenacity wait that asks THE retry policy, with the server's Retry-After.

    Holds: one per pull; the exponential step counts only the attempts in a row that ended
    without a Retry-After (an answer that said when to come back was the server spacing its
    callers, not a failure to reach it), so a timeout after a long run of obeyed 503s starts
    again at the base, not at the cap.

    Why: docs/design/0040-agent-backoff-counts-only-unguided-failures.md"""

    def __init__(self, policy: RetryPolicy, rng: RandomSource | None) -> None:
        self._policy = policy
        self._rng = rng
        self._unguided = 0  # attempts in a row that ended without a Retry-After

    def __call__(self, retry_state: RetryCallState) -> float:
        retry_after = None
        if retry_state.outcome is not None and not retry_state.outcome.failed:
            result = retry_state.outcome.result()
            if isinstance(result, Temporary):
                retry_after = result.retry_after
        if retry_after is not None:
            self._unguided = 0
            attempt = retry_state.attempt_number  # sizes only the jitter window around it
        else:
            self._unguided += 1
            attempt = self._unguided
        return next_delay(self._policy, attempt, retry_after=retry_after, rng=self._rng)


class BrokerClient:
    def __init__(
        self,
        *,
        base_url: str | None,
        identity: Identity,
        policy: RetryPolicy,
        timeout: float,
        verify: ssl.SSLContext | bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock,
        rng: RandomSource | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._identity = identity
        self._policy = policy
        self._clock = clock
        self._rng = rng
        self._sleep = sleep
        self._base = base_url.rstrip("/") if base_url else None
        self._http = httpx.AsyncClient(
            base_url=self._base or "",
            verify=verify,
            timeout=timeout,
            transport=transport,
            headers={"Accept": f"application/json, {PROBLEM_JSON}", "User-Agent": "compass-agent"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def base_url(self) -> str | None:
        return self._base

    def point_at(self, base_url: str) -> None:
        """Where the next request goes: the broker URL can be found (or move) at runtime."""
        base = base_url.rstrip("/")
        if base != self._base:
            self._base = base
            self._http.base_url = httpx.URL(base)

    async def _post(
        self, runtime_id: str, endpoint: str, body: bytes
    ) -> httpx.Response | Temporary:
        try:
            authorization = await self._identity.authorization()
        except IdentityError as e:
            return Temporary(reason=f"identity: {e}")
        if self._base is None:
            return Temporary(reason="no broker URL yet")
        headers = {"Content-Type": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        path = f"/v1/runtimes/{quote(runtime_id, safe='')}/{endpoint}"
        try:
            return await self._http.post(path, headers=headers, content=body)
        except httpx.TransportError as e:
            # Server and cause (never the path or a header): "the broker is unreachable" is
            # worth nothing to an operator without where and why.
            return Temporary(
                reason=f"transport: {type(e).__name__}", detail=describe_transport_error(e)
            )

    async def request_once(self, runtime_id: str) -> Outcome:
        answer = await self._post(runtime_id, "token", b"{}")
        if isinstance(answer, Temporary):
            return answer
        return outcome_of(answer, now=self._clock())

    async def report(self, runtime_id: str, body: bytes) -> ReportOutcome:
        """One connection report (`agent.connection_report` builds the body); never retried here."""
        answer = await self._post(runtime_id, "connection", body)
        if isinstance(answer, Temporary):
            return answer
        return report_outcome_of(answer, now=self._clock())

    async def pull(
        self, runtime_id: str, *, on_attempt: AttemptHook | None = None
    ) -> Issued | Refused:
        """Asks until the broker gives a token or a permanent refusal; never gives up otherwise."""

        async def attempt() -> Outcome:
            outcome = await self.request_once(runtime_id)
            if on_attempt is not None:
                on_attempt(outcome)
            if isinstance(outcome, Temporary):
                log.info(
                    "broker not ready, will retry",
                    extra={
                        "runtime_id": runtime_id,
                        "reason": outcome.reason,
                        **({"detail": outcome.detail} if outcome.detail else {}),
                        "status": outcome.status,
                        "retry_after": outcome.retry_after,
                    },
                )
            return outcome

        retrying = AsyncRetrying(
            retry=retry_if_result(lambda o: isinstance(o, Temporary)),
            wait=_BackoffWait(self._policy, self._rng),
            stop=stop_never,
            sleep=self._sleep,
            reraise=True,
        )
        result: Outcome = await retrying(attempt)
        assert isinstance(result, Issued | Refused)
        return result
