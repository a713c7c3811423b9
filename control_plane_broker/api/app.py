"""FastAPI application: the token and connection report endpoints, health, readiness, metrics,
and /openapi.json when asked for (BROKER_API_DOCS).

Holds: every error leaves as application/problem+json; request logs carry method, path, status
and duration, never headers or bodies
(`api.access`); metrics are recorded here (the request loop), not below.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import FastAPI, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane_broker.api.access import AccessLog, note_problem, upstream_cause
from control_plane_broker.api.first_contact_middleware import arrived_at, identity_checked
from control_plane_broker.api.problems import MEDIA_TYPE, problem_for, type_uri
from control_plane_broker.connections.report_rules import Report
from control_plane_broker.connections.report_service import ConnectionReporter
from control_plane_broker.errors import BrokerError, InternalError, MalformedRequest
from control_plane_broker.issuing.token_issuer import TokenIssuer
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload.retry_after import Jitter
from control_plane_broker.policy import RUNTIME_ID_PATTERN, RUNTIME_ID_RULE
from control_plane_broker.registration.state import to_rfc3339
from control_plane_broker.text import for_humans

log = logging.getLogger("control_plane_broker.access")

# What every runtime endpoint takes: the runtime ID in the path and the caller's proof.
RuntimeIdParam = Annotated[
    str,
    Path(
        pattern=RUNTIME_ID_PATTERN,
        description="The Kyma runtime ID (the Kyma's `kyma-project.io/runtime-id`).",
    ),
]
AuthorizationHeader = Annotated[
    str | None, Header(description="`Bearer <ServiceAccount token>` (tokenreview, jwks)")
]
XfccHeader = Annotated[str | None, Header(description="Set by the gateway (xfcc mode)")]


class TokenResponse(BaseModel):
    token: str = Field(description="One-time token for the Compass Connector.")
    connectorURL: str
    compassRuntimeID: str
    tenant: str = Field(description="Global account ID, the Tenant in Compass.")
    expiresAt: str | int | float | None = None


MAX_REPORT_BYTES = 4096
ConnectionState = Literal[
    "Connected",
    "ConnectionFailed",
    "ConnectionMaintenanceFailed",
    "SynchronizationFailed",
    "ResourceApplicationFailed",
    "MetadataUpdateFailed",
    "Synchronized",
    "NotFound",
]
# RFC 3339 `date-time` text only: strict, so a JSON number is not taken for a Unix time, and
# shaped like one, since pydantic also reads a numeric string ("5449") as a Unix time and takes
# a space for the "T" (both found by the schema fuzzer).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339_text(value: object) -> object:
    if not isinstance(value, str):
        return value  # strict: refused below
    if not _RFC3339.fullmatch(value):
        raise ValueError("not an RFC 3339 date-time")
    return datetime.fromisoformat(value.upper())


Timestamp = Annotated[AwareDatetime, Strict(), BeforeValidator(_rfc3339_text)]


class ConnectionReportBody(BaseModel):
    """What the agent observed in its runtime's `CompassConnection`."""

    model_config = ConfigDict(extra="forbid")

    connectionState: ConnectionState = Field(
        description="`status.connectionState` of the CompassConnection, or `NotFound` when "
        "there is none (yet)."
    )
    certificateNotAfter: Timestamp | None = Field(
        default=None,
        description="`status.connectionStatus.certificateStatus.notAfter` (RFC 3339).",
    )
    lastError: str | None = Field(
        default=None, max_length=1024, description="`status.connectionStatus.error`."
    )
    tokenSha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (lower-case hex) of the last one-time token the agent received; "
        "never the token.",
    )
    observedAt: Timestamp = Field(description="When the agent read the state (RFC 3339).")


class ReportAccepted(BaseModel):
    nextReportAfterSeconds: int = Field(
        description="The heartbeat the broker wishes; the agent reports after at most this "
        "long (jittered) unless something changes first."
    )


_NAIVE_EPOCH = datetime(1970, 1, 1)


def epoch_seconds(stamp: datetime) -> float:
    """Seconds since the epoch for any aware time pydantic accepts, years 1-9999 with any offset
    included (`datetime.timestamp` overflows at the ends; a report must not be refused for it)."""
    offset = stamp.utcoffset() or timedelta(0)
    return (stamp.replace(tzinfo=None) - _NAIVE_EPOCH - offset).total_seconds()


def report_from_body(body: ConnectionReportBody) -> Report:
    return Report(
        state=body.connectionState,
        observed_at=epoch_seconds(body.observedAt),
        certificate_not_after=(
            to_rfc3339(epoch_seconds(body.certificateNotAfter))
            if body.certificateNotAfter is not None
            else None
        ),
        # Shown to operators in status, condition and Event: no terminal control, no bidi.
        last_error=for_humans(body.lastError) if body.lastError is not None else None,
        token_sha256=body.tokenSha256,
    )


async def read_report(request: Request) -> Report:
    """The request body, at most `MAX_REPORT_BYTES` (read no further), as a validated report."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_REPORT_BYTES):
        raise MalformedRequest(f"the body must be JSON of at most {MAX_REPORT_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REPORT_BYTES:
            raise MalformedRequest(f"the body must be JSON of at most {MAX_REPORT_BYTES} bytes")
    try:
        parsed = ConnectionReportBody.model_validate_json(bytes(body))
    except ValidationError:
        # Which field failed, never the value: the body is the caller's input.
        raise MalformedRequest("the connection report failed validation") from None
    return report_from_body(parsed)


def _report_request_body() -> dict[str, object]:
    schema = ConnectionReportBody.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"required": True, "content": {"application/json": {"schema": schema}}}


class ProblemModel(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    instance: str


_PROBLEMS: dict[int, str] = {
    400: "Malformed runtime ID or request",
    401: "Identity not proven",
    403: "Proven identity, not for this runtime or ServiceAccount not allowed; (BYOC) the "
    "token's issuer awaits an operator's approval; or the runtime is revoked",
    404: "No Kyma for this runtime",
    409: "Module not enabled or Kyma being deleted",
    429: "Per-runtime rate limit (Retry-After)",
    502: "Compass rejected the request",
    503: "Compass or control plane unavailable (Retry-After)",
}


def _problem_responses(
    *, without: tuple[int, ...] = (), overrides: dict[int, str] | None = None
) -> dict[int | str, dict[str, object]]:
    out: dict[int | str, dict[str, object]] = {}
    texts = _PROBLEMS | (overrides or {})
    for status, text in texts.items():
        if status in without:
            continue
        out[status] = {"model": ProblemModel, "description": text, "content": {MEDIA_TYPE: {}}}
    return out


def _nothing_degraded() -> list[str]:
    return []


@dataclass(frozen=True)
class Health:
    """What the probes answer.

    `ready`: whether this replica should get traffic, and what keeps it from it (/readyz 503).
    `degraded`: what fails for every replica alike but leaves this one worth its traffic; /readyz
    names it and stays 200. Director's OAuth token endpoint refusing the broker's credentials is
    such a thing, so it is reported here and does not fail readiness, for three reasons:

    - Readiness decides traffic (docs/operations.md: a replica not ready gets none). Every
      replica reads the same credentials Secret, so a refusal would take every replica out of
      the Service at once: the whole fleet turned away, its connection reports (no Director
      call) and identity answers lost, and the agents told nothing (no 503 with Retry-After, no
      problem type) instead of 503 `compass-unavailable` with Retry-After, which they handle.
    - A replica out of the Service gets no token request, so it would not ask the token
      endpoint again and would never see the credentials fixed.
    - It cannot stop a rollout with bad credentials anyway: the broker contacts nothing before
      serving, so a new replica learns of a refusal only from the first token request it gets.
      `compass-broker --check-config` is the check a rollout runs for that.

    The refusal is visible instead in the ERROR log line, `broker_director_credentials_ok` (0)
    and the /readyz body.
    """

    ready: Callable[[], tuple[bool, list[str]]]  # (ready, what is missing)
    live: Callable[[], bool]  # False once the event loop was wedged
    degraded: Callable[[], list[str]] = _nothing_degraded


def _still_connected(request: Request) -> Callable[[], Awaitable[bool]]:
    """Whether the client still waits for this request's answer (no body is read by the token
    endpoint, so consuming the request message here loses nothing)."""

    async def check() -> bool:
        return not await request.is_disconnected()

    return check


def problem_response(
    exc: BrokerError, path: str, *, jitter_max: float, rand: Jitter
) -> JSONResponse:
    p = problem_for(exc, instance=path, jitter_max=jitter_max, rand=rand)
    cause = upstream_cause(exc)
    if cause is not None:
        # The answer says "unavailable"; the operator needs which server and why.
        log.warning("upstream request failed", extra={"problem": exc.slug, "cause": cause})
    return JSONResponse(p.body, status_code=p.status, headers=p.headers, media_type=MEDIA_TYPE)


def routing_slug(exc: StarletteHTTPException) -> str:
    return {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")


def routing_problem(exc: StarletteHTTPException, path: str) -> JSONResponse:
    """Routing errors (no such path, e.g. a runtime ID with a slash; wrong method) leave as
    problems too, so every error a client sees has one shape."""
    slug = routing_slug(exc)
    body = {
        "type": type_uri(slug),
        "title": str(exc.detail),
        "status": exc.status_code,
        "detail": str(exc.detail),
        "instance": path,
    }
    return JSONResponse(
        body, status_code=exc.status_code, headers=exc.headers, media_type=MEDIA_TYPE
    )


def unexpected(exc: Exception, **where: str) -> InternalError:
    """A bug, not an answer: logged with its type (never its text, which may hold input), and
    answered as a problem the caller retries, never as a bare 500."""
    log.error("unexpected error", extra={**where, "error": type(exc).__name__})
    return InternalError("unexpected error in the broker", retry_after=5)


@contextmanager
def answered_as_problem(counter: Counter) -> Iterator[None]:
    """A route's errors, counted under their problem's slug in `counter` (the endpoint's
    requests by outcome) and left to the problem handlers; a bug becomes an `InternalError`
    here, so the route counts it too and the access log sees a problem, not an exception."""
    try:
        yield
    except BrokerError as exc:
        counter.labels(exc.slug).inc()
        raise
    except Exception as exc:
        counter.labels(InternalError.slug).inc()
        raise unexpected(exc) from None


def create_app(
    *,
    issuer: TokenIssuer,
    reporter: ConnectionReporter,
    metrics: Metrics,
    health: Health,
    jitter_max: float,
    rand: Jitter = random.random,
    access_log: bool = True,
    api_docs: bool = False,
) -> FastAPI:
    """`access_log=False`: the caller logs requests outside (the broker does, around the
    first-contact limit, so that the requests it answers are logged too). `api_docs`: serve
    /openapi.json; never FastAPI's Swagger UI or ReDoc pages, which load their scripts from a
    CDN into the browser of whoever opens them on an unauthenticated port."""
    app = FastAPI(
        title="compass-broker",
        summary="Issues Compass one-time tokens to Kyma runtimes that prove their identity.",
        version="1",
        openapi_url="/openapi.json" if api_docs else None,
        docs_url=None,
        redoc_url=None,
    )
    add_problem_handlers(app, metrics=metrics, jitter_max=jitter_max, rand=rand)
    if access_log:
        app.add_middleware(AccessLog)
    add_token_route(app, issuer=issuer, metrics=metrics)
    add_connection_route(app, reporter=reporter, metrics=metrics)
    add_operations_routes(app, health=health, metrics=metrics)
    return app


def add_problem_handlers(
    app: FastAPI, *, metrics: Metrics, jitter_max: float, rand: Jitter
) -> None:
    """Every error leaves as a problem: the broker's own, validation, routing, and bugs."""

    def problem(exc: BrokerError, request: Request) -> JSONResponse:
        note_problem(request.scope, exc.slug)
        return problem_response(exc, request.url.path, jitter_max=jitter_max, rand=rand)

    @app.exception_handler(BrokerError)
    async def _broker_error(request: Request, exc: BrokerError) -> JSONResponse:
        return problem(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if any("runtimeID" in (error.get("loc") or ()) for error in exc.errors()):
            # The route's own check (the pattern is in the OpenAPI description): counted as
            # the endpoint's malformed requests, like any other refusal of it.
            counter = (
                metrics.connection_reports
                if request.url.path.endswith("/connection")
                else metrics.token_requests
            )
            counter.labels(MalformedRequest.slug).inc()
            return problem(MalformedRequest(RUNTIME_ID_RULE), request)
        return problem(MalformedRequest("request failed validation"), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        note_problem(request.scope, routing_slug(exc))
        return routing_problem(exc, request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return problem(unexpected(exc, path=request.url.path), request)


def add_token_route(app: FastAPI, *, issuer: TokenIssuer, metrics: Metrics) -> None:
    @app.post(
        "/v1/runtimes/{runtimeID}/token",
        status_code=201,
        response_model=TokenResponse,
        responses=_problem_responses(),
        summary="Issue a one-time token for this runtime's compass-runtime-agent",
    )
    async def issue_token(
        runtimeID: RuntimeIdParam,
        request: Request,
        authorization: AuthorizationHeader = None,
        x_forwarded_client_cert: XfccHeader = None,
    ) -> TokenResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        with metrics.request_seconds.time(), answered_as_problem(metrics.token_requests):
            issued = await issuer.issue(
                runtimeID,
                headers,
                caller_present=_still_connected(request),
                identity_checked=identity_checked(request.scope, give_place_up=True),
                arrived_at=arrived_at(request.scope),
            )
        metrics.token_requests.labels("issued").inc()
        return TokenResponse(
            token=issued.token,
            connectorURL=issued.connector_url,
            compassRuntimeID=issued.compass_runtime_id,
            tenant=issued.tenant,
            expiresAt=issued.expires_at,
        )


def add_connection_route(app: FastAPI, *, reporter: ConnectionReporter, metrics: Metrics) -> None:
    @app.post(
        "/v1/runtimes/{runtimeID}/connection",
        status_code=202,
        response_model=ReportAccepted,
        responses=_problem_responses(
            without=(502,),
            overrides={
                400: "Malformed runtime ID, or a body that is not a valid report of at most "
                f"{MAX_REPORT_BYTES} bytes",
                409: "Module not enabled, Kyma being deleted, or no mapping for the runtime yet",
                429: "More than one report per runtime per BROKER_REPORT_MIN_INTERVAL_SECONDS "
                "(Retry-After)",
                503: "Control plane unavailable or not ready (Retry-After)",
            },
        ),
        openapi_extra={"requestBody": _report_request_body()},
        summary="Report this runtime's Compass connection state (costs no Director call)",
    )
    async def report_connection(
        runtimeID: RuntimeIdParam,
        request: Request,
        authorization: AuthorizationHeader = None,
        x_forwarded_client_cert: XfccHeader = None,
    ) -> ReportAccepted:
        headers = {k.lower(): v for k, v in request.headers.items()}
        with answered_as_problem(metrics.connection_reports):
            report = await read_report(request)
            written = await reporter.report(
                runtimeID,
                headers,
                report,
                identity_checked=identity_checked(request.scope, give_place_up=False),
            )
        metrics.connection_reports.labels("recorded" if written else "unchanged").inc()
        return ReportAccepted(nextReportAfterSeconds=reporter.next_report_after)


def add_operations_routes(app: FastAPI, *, health: Health, metrics: Metrics) -> None:
    """Liveness, readiness and the Prometheus scrape."""

    @app.get("/healthz", summary="Liveness: the event loop has not been wedged")
    async def healthz() -> JSONResponse:
        ok = health.live()
        return JSONResponse({"status": "ok" if ok else "wedged"}, status_code=200 if ok else 503)

    @app.get(
        "/readyz",
        summary="Readiness: caches synced and fresh, background tasks running; also names what "
        "fails for every replica alike without failing readiness (`degraded`: Director's OAuth "
        "token endpoint refusing the broker's credentials)",
    )
    async def readyz() -> JSONResponse:
        ok, problems = health.ready()
        return JSONResponse(
            {
                "status": "ready" if ok else "not ready",
                "problems": problems,
                "degraded": health.degraded(),
            },
            status_code=200 if ok else 503,
        )

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
