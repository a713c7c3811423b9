"""The access log and the request ID: one line per request, and an ID on every line of it.

Holds: every request has an ID — the caller's `X-Request-ID` when it is a plausible one (at most
`MAX_REQUEST_ID` characters of letters, digits and `-._:`), otherwise a fresh one, never the
caller's text: it is echoed in the answer and written into every log line, so it must not be
able to forge a line, carry a terminal escape or grow the logs. The ID is bound to the request's
context (`observability.logs.bind_request_id`), so every line logged while the request is served
carries it, whichever module writes it. The access line has method, path, status, seconds, the
problem type of an error answer and the Retry-After it was told; nothing else of the request.
Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) are logged at DEBUG while they succeed:
kubelet and Prometheus call them every few seconds, and a failing probe is still news (INFO).

A pure ASGI middleware: Starlette's `BaseHTTPMiddleware` costs a task and a stream per request,
which at thousands of requests per second is most of a 503's price.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubeapi import KubeError, describe_transport_error
from observability import logs

log = logging.getLogger("control_plane_broker.access")

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*", re.ASCII)
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


def request_id_from(header: str | None) -> str:
    """The caller's request ID when it is safe to echo and log, else a new one."""
    if header is not None and len(header) <= MAX_REQUEST_ID and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def access_level(path: str, status: int) -> int:
    """DEBUG for a probe or scrape that succeeded, INFO for everything else."""
    return logging.DEBUG if path in PROBES and status < 400 else logging.INFO


def upstream_cause(exc: BaseException) -> str | None:
    """What a server behind the broker (KCP, a runtime's API server, an issuer, Director, its
    OAuth endpoint) did, when that is why `exc` was answered: the first request failure down
    the cause chain, with its server and cause. None for the broker's own refusals (breaker
    open, no slot, a bad proof): those name themselves in the problem type."""
    seen = exc.__cause__
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, httpx.HTTPError):
            return describe_transport_error(seen)
        if isinstance(seen, KubeError):
            return seen.message
        seen = seen.__cause__
    return None


NOTE_KEY = "compass.access_note"  # scope key: what the app tells the access log


@dataclass
class _Note:
    """What the app tells the access log about the answer (one per request), through the ASGI
    scope: the middlewares in between pass the same object on, also in a copy of the scope."""

    problem: str | None = None


def note_problem(scope: Scope, slug: str) -> None:
    """Called where a problem answer is made: its type goes into the access line."""
    note = scope.get(NOTE_KEY)
    if isinstance(note, _Note):
        note.problem = slug


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500
        retry_after: str | None = None
        offered = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                offered = value.decode("latin-1")
                break
        request_id = request_id_from(offered)
        note = _Note()
        scope[NOTE_KEY] = note
        bound = logs.bind_request_id(request_id)

        async def send_and_note(message: Message) -> None:
            nonlocal status, retry_after
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [
                    (name, value)
                    for name, value in message.get("headers", ())
                    if name.lower() != b"x-request-id"
                ]
                for name, value in headers:
                    if name.lower() == b"retry-after":
                        retry_after = value.decode("latin-1")
                headers.append((b"x-request-id", request_id.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self._app(scope, receive, send_and_note)
        finally:
            path = str(scope.get("path", ""))
            log.log(
                access_level(path, status),
                "request",
                extra={
                    "method": scope.get("method"),
                    "path": path,
                    "status": status,
                    "seconds": round(time.monotonic() - started, 4),
                    **({"problem": note.problem} if note.problem is not None else {}),
                    **({"retry_after": retry_after} if retry_after is not None else {}),
                },
            )
            logs.unbind_request_id(bound)
