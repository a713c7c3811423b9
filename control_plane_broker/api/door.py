"""The door in front of the runtime endpoints: first contacts come in a few at a time.

After an outage or a restart thousands of agents ask within a second, most of them for the first
time since this process started: proving who they are means fetching their cluster's keys (or a
TokenReview), the costliest work of a request. Let into the app at once, all of them run their
first steps (routing, validation, the identity check up to its first network call) in one turn of
the event loop: measured at N = 5,000, that turn took 2 s, Director's calls in flight waited for
it (their slots held, Director idle), and the requests parked deep in the app held 190 MB.

So a pure ASGI layer in front of FastAPI parks the requests of runtimes the broker has not proven
recently in arrival order, and lets `capacity` of them in at a time; a token request leaves its
place as soon as its identity check is over (`leave_door` in the scope, called by the use case),
not when its answer is sent (a connection report, which never waits for Director, at its end):
an admitted request may then wait for Director's capacity for seconds without holding the
door. A parked request costs a task and a few frames, and no CPU.

Runtimes proven recently (`is_known`) walk past: checking them needs no network, and among them
are the agents coming back on a booked turn, which must not queue behind the herd of first
contacts while Director waits for them. Being let past is a matter of order only: every request
is checked in full inside.

Holds: every request that enters leaves its place exactly once (the use case's call, or the end
of the request, whichever is first), also when it fails or its client hangs up; other paths and
methods are never held; at most `capacity` unknown callers are inside at once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

LEAVE_KEY = "compass.leave_door"  # scope key of the callable that gives the place up
_RUNTIME_PATH = re.compile(r"^/v1/runtimes/([^/]{1,64})/(?:token|connection)$")


def leave_door(scope: Scope) -> Callable[[], None] | None:
    """The callable that gives this request's place at the door up (None: it held none)."""
    leave = scope.get(LEAVE_KEY)
    return leave if callable(leave) else None


class Door:
    def __init__(self, app: ASGIApp, *, capacity: int, is_known: Callable[[str], bool]) -> None:
        self._app = app
        self._places = asyncio.Semaphore(capacity)
        self._is_known = is_known
        self.waiting = 0  # parked at the door now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime_id = _runtime_of(scope)
        if runtime_id is None or self._is_known(runtime_id):
            await self._app(scope, receive, send)
            return
        self.waiting += 1
        try:
            await self._places.acquire()
        finally:
            self.waiting -= 1
        left = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                self._places.release()

        try:
            await self._app({**scope, LEAVE_KEY: leave}, receive, send)
        finally:
            leave()


def _runtime_of(scope: Scope) -> str | None:
    if scope["type"] != "http" or scope.get("method") != "POST":
        return None
    match = _RUNTIME_PATH.match(scope.get("path", ""))
    return match.group(1) if match else None
