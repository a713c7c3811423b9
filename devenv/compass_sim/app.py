"""The HTTP layer: Compass endpoints behind the fault pipeline, and the admin API.

Every request to `/oauth/token`, `/director/graphql` or `/connector/graphql` goes
through the same pipeline:

1. read the body and name its operations (GraphQL root fields, or `oauthToken`);
2. `FaultState.admit`: down (503 / dropped connection), rate limit (429 +
   Retry-After), injected HTTP errors; such a request is not executed;
3. Director requests take a capacity slot (waiting while the limit is reached);
4. latency, then the endpoint's handler (injected GraphQL errors fire inside it);
5. a lost response is turned into a 504 or a dropped connection *after* the
   handler's effects are committed;
6. one `RequestRecord` per operation.

`/_sim/...` (admin, JSON) never passes through the pipeline, so it stays reachable
while Compass is "down"; it is served on the main listener and on the separate
admin listener (the only one left while the main listener refuses connections).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.responses import Response as StarletteResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .calls import Call
from .connector import get_request_body
from .faults import Faults, LostResponseMode, Refusal
from .graphql_http import Response, RootField
from .operations import OAUTH_TOKEN, UNPARSED, Endpoint
from .recorder import Outcome

if TYPE_CHECKING:
    from .server import CompassSimulator

__all__ = ["build_admin_app", "build_main_app"]

_RAW_SEND = "compass_sim.raw_send"


class _RawSendCapture:
    """Keeps the server's own `send` in the scope, so a response can drop the connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[_RAW_SEND] = send
        await self.app(scope, receive, send)


class DropConnection(StarletteResponse):
    """Closes the TCP connection without sending any response."""

    def __init__(self) -> None:
        super().__init__(status_code=500)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's `send` is a bound method of the request cycle that owns the transport.
        raw_send = scope.get(_RAW_SEND)
        transport = getattr(getattr(raw_send, "__self__", None), "transport", None)
        if transport is not None:
            transport.abort()
            # Let the server see the connection is gone before the app returns, so it
            # does not try to answer with a 500 of its own.
            for _ in range(3):
                await asyncio.sleep(0)
            return
        # Unknown server: promise a body and never send it; the server closes the connection.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]}
        )


_OUTCOME_OF_REFUSAL: dict[str, Outcome] = {
    "unavailable": Outcome.UNAVAILABLE,
    "dropped": Outcome.DROPPED,
    "rate_limited": Outcome.RATE_LIMITED,
    "injected_error": Outcome.INJECTED_ERROR,
}


class CompassRoutes:
    """The Compass endpoints of one simulator."""

    def __init__(self, sim: CompassSimulator) -> None:
        self.sim = sim

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/oauth/token", self.oauth_token, methods=["POST"]),
            Route("/director/graphql", self.director, methods=["POST"]),
            Route("/connector/graphql", self.connector, methods=["GET", "POST"]),
        ]

    async def oauth_token(self, request: Request) -> StarletteResponse:
        body = await request.body()
        authorization = request.headers.get("authorization")

        def run(call: Call) -> Response:
            result = self.sim.oauth.handle(authorization=authorization, body=body, call=call)
            return Response(result.status, result.body, headers=result.headers)

        return await self._serve("oauth", [RootField(OAUTH_TOKEN, OAUTH_TOKEN)], None, run)

    async def director(self, request: Request) -> StarletteResponse:
        parsed = self.sim.director.endpoint.parse_request(await request.body())
        authorization = request.headers.get("authorization")
        tenant = request.headers.get("tenant")

        def run(call: Call) -> Response:
            return self.sim.director.handle(
                parsed, authorization=authorization, tenant=tenant, call=call
            )

        return await self._serve("director", parsed.fields, tenant, run)

    async def connector(self, request: Request) -> StarletteResponse:
        body = (
            get_request_body(request.query_params)
            if request.method == "GET"
            else await request.body()
        )
        parsed = self.sim.connector.endpoint.parse_request(body)
        # The hydrator takes the token from the header, else from the query parameter.
        token = request.headers.get("connector-token") or request.query_params.get("token")

        def run(call: Call) -> Response:
            return self.sim.connector.handle(parsed, token=token, call=call)

        return await self._serve("connector", parsed.fields, None, run)

    async def _serve(
        self,
        endpoint: Endpoint,
        fields: Sequence[RootField],
        tenant: str | None,
        run: Callable[[Call], Response],
    ) -> StarletteResponse:
        started = time.perf_counter()
        fields = list(fields) or [RootField(UNPARSED, UNPARSED)]
        sim = self.sim

        refusal = sim.faults_state.admit(endpoint, [f.name for f in fields])
        if refusal is not None:
            outcome = _OUTCOME_OF_REFUSAL[refusal.kind]
            self._record(
                endpoint=endpoint,
                fields=fields,
                tenant=tenant,
                outcome_of=lambda _f: outcome,
                status=refusal.http_status,
                codes={},
                started=started,
            )
            return _refusal_response(refusal)

        slot: AbstractAsyncContextManager[None] = (
            sim.capacity.slot() if endpoint == "director" else nullcontext()
        )
        async with slot:
            delay = sim.faults_state.delay(endpoint)
            if delay > 0:
                await asyncio.sleep(delay)
            call = Call(sim.faults_state)
            response = run(call)

        lost = call.lost
        status: int | None = response.status
        if lost is not None:
            status = 504 if lost is LostResponseMode.GATEWAY_TIMEOUT else None

        def outcome_of(f: RootField) -> Outcome:
            if f.key in call.injected:
                return Outcome.INJECTED_ERROR
            if f.key in call.after_commit:
                return Outcome.ERROR_AFTER_COMMIT
            if lost is not None:
                return Outcome.LOST_RESPONSE
            if response.errors_by_key.get(f.key) or response.status >= 400:
                return Outcome.ERROR
            return Outcome.OK

        self._record(
            endpoint=endpoint,
            fields=fields,
            tenant=tenant,
            outcome_of=outcome_of,
            status=status,
            codes=response.errors_by_key,
            started=started,
        )
        if lost is LostResponseMode.DROP:
            return DropConnection()
        if lost is LostResponseMode.GATEWAY_TIMEOUT:
            return PlainTextResponse("upstream request timeout", status_code=504)
        if response.body is None:
            return StarletteResponse(b"", status_code=response.status, headers=response.headers)
        return JSONResponse(response.body, status_code=response.status, headers=response.headers)

    def _record(
        self,
        *,
        endpoint: Endpoint,
        fields: Sequence[RootField],
        tenant: str | None,
        outcome_of: Callable[[RootField], Outcome],
        status: int | None,
        codes: dict[str, list[int]],
        started: float,
    ) -> None:
        at = datetime.fromtimestamp(self.sim.clock(), UTC)
        duration = time.perf_counter() - started
        for f in fields:
            self.sim.recorder.record(
                at=at,
                endpoint=endpoint,
                operation=f.name,
                tenant=tenant,
                outcome=outcome_of(f),
                http_status=status,
                error_codes=codes.get(f.key, []),
                duration_seconds=duration,
            )


def _refusal_response(refusal: Refusal) -> StarletteResponse:
    if refusal.http_status is None:
        return DropConnection()
    headers = {}
    if refusal.retry_after_seconds is not None:
        headers["Retry-After"] = str(refusal.retry_after_seconds)
    if refusal.kind == "rate_limited":
        body: dict[str, Any] = {"error": "rate limit exceeded"}
    elif refusal.kind == "unavailable":
        body = {"error": "service unavailable"}
    else:
        body = {"error": "injected failure", "operation": refusal.operation}
    return JSONResponse(body, status_code=refusal.http_status, headers=headers)


# -- admin API ----------------------------------------------------------------------


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    return value


def _json(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(_dump(value), status_code=status)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    return json.loads(raw) if raw.strip() else {}


def admin_routes(sim: CompassSimulator) -> list[BaseRoute]:
    async def health(_request: Request) -> JSONResponse:
        faults = sim.faults()
        return _json({"ok": True, "down": faults.down, "listening": sim.listening})

    async def get_faults(_request: Request) -> JSONResponse:
        return _json(sim.faults())

    async def put_faults(request: Request) -> JSONResponse:
        try:
            faults = Faults.model_validate(await _json_body(request))
        except (ValueError, ValidationError) as exc:
            return _json({"error": str(exc)}, 422)
        return _json(await sim.apply_faults(faults))

    async def patch_faults(request: Request) -> JSONResponse:
        try:
            changes = await _json_body(request)
            faults = Faults.model_validate({**sim.faults().model_dump(), **changes})
        except (ValueError, ValidationError, TypeError) as exc:
            return _json({"error": str(exc)}, 422)
        return _json(await sim.apply_faults(faults))

    async def delete_faults(_request: Request) -> JSONResponse:
        return _json(await sim.apply_faults(Faults()))

    async def counters(_request: Request) -> JSONResponse:
        return _json(sim.counters())

    async def concurrency(_request: Request) -> JSONResponse:
        return _json(sim.concurrency())

    async def requests(request: Request) -> JSONResponse:
        query = request.query_params
        outcome = query.get("outcome")
        try:
            records = sim.request_log(
                operation=query.get("operation"),
                tenant=query.get("tenant"),
                outcome=Outcome(outcome) if outcome else None,
                since_seq=int(query.get("since", "0")),
            )
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        return _json(records)

    async def reset(request: Request) -> JSONResponse:
        try:
            options = await _json_body(request)
            await sim.reset_async(
                state=bool(options.get("state", True)),
                faults=bool(options.get("faults", True)),
                counters=bool(options.get("counters", True)),
            )
        except (ValueError, AttributeError) as exc:
            return _json({"error": str(exc)}, 400)
        return _json({"ok": True})

    async def list_runtimes(request: Request) -> JSONResponse:
        return _json(sim.runtimes(tenant=request.query_params.get("tenant")))

    async def seed_runtime(request: Request) -> JSONResponse:
        try:
            body = await _json_body(request)
            record = sim.seed_runtime(
                tenant=body["tenant"],
                name=body["name"],
                labels=body.get("labels"),
                description=body.get("description"),
                runtime_id=body.get("id"),
            )
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            return _json({"error": f"invalid runtime: {exc}"}, 422)
        return _json(record, 201)

    async def tokens(request: Request) -> JSONResponse:
        return _json(sim.connector_tokens(runtime_id=request.query_params.get("runtime_id")))

    async def save(_request: Request) -> JSONResponse:
        return _json({"saved": sim.save_state()})

    routes: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/faults", get_faults, methods=["GET"]),
        Route("/faults", put_faults, methods=["PUT"]),
        Route("/faults", patch_faults, methods=["PATCH"]),
        Route("/faults", delete_faults, methods=["DELETE"]),
        Route("/counters", counters, methods=["GET"]),
        Route("/concurrency", concurrency, methods=["GET"]),
        Route("/requests", requests, methods=["GET"]),
        Route("/reset", reset, methods=["POST"]),
        Route("/runtimes", list_runtimes, methods=["GET"]),
        Route("/runtimes", seed_runtime, methods=["POST"]),
        Route("/tokens", tokens, methods=["GET"]),
        Route("/save", save, methods=["POST"]),
    ]

    async def index(_request: Request) -> JSONResponse:
        # What the demo prints as the admin URL: the map of what is here.
        endpoints: dict[str, list[str]] = {}
        for route in routes:
            if isinstance(route, Route):
                endpoints.setdefault(route.path, []).extend(sorted(route.methods or ()))
        return _json({"endpoints": {path: sorted(set(m)) for path, m in endpoints.items()}})

    return [Route("/", index, methods=["GET"]), *routes]


def build_main_app(sim: CompassSimulator) -> ASGIApp:
    routes = [*CompassRoutes(sim).routes(), Mount("/_sim", routes=admin_routes(sim))]
    return _RawSendCapture(Starlette(routes=routes))


def build_admin_app(sim: CompassSimulator) -> ASGIApp:
    return Starlette(routes=[Mount("/_sim", routes=admin_routes(sim))])
