"""The first-contact limit in front of the runtime endpoints, as an ASGI middleware: requests of
runtimes the broker has not proven recently come into the app `capacity` at a time.

It parks those requests in arrival order, before FastAPI, where a parked request costs a task
and a few frames and no CPU. A token request gives its place up as soon as its identity check is
over (`release_first_contact_place` in the scope, called by the use case), not when its answer
is sent (a connection report, which never waits for Director, at its end): an admitted request
may then wait for Director's capacity for seconds without holding a place.

Runtimes proven recently (`is_known`) are not limited: checking them needs no network, and among
them are the agents coming back at their reservation, which must not queue behind the herd of
first contacts while Director waits for them. This is a matter of order only: every request is
checked in full inside. The rules (the rate, when a newcomer is refused and for how long, one
runtime's share, which holds are measured) are `overload/first_contact_limit`'s; a refusal is
503 `first-contacts-busy`, answered here before any work. A request still parked after twice
`max_wait` (the rate was misjudged) is answered so too.

Holds: every request that enters leaves its place exactly once (the use case's call, or the end
of the request, whichever is first), also when it fails or its client hangs up, or is answered
here without having entered; other paths and methods are never held; at most `capacity`
unknown callers are inside at once; by the measured rate none waits here longer than
`max_wait`, and none longer than twice that; a runtime's own queue exists only while one of its
requests is here.
Why: docs/design/0001-first-contacts-a-few-at-a-time.md (and 0002-0004).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from control_plane_broker.api.access import note_problem
from control_plane_broker.api.problems import MEDIA_TYPE, problem_for
from control_plane_broker.errors import FirstContactsBusy
from control_plane_broker.overload import first_contact_limit
from control_plane_broker.overload.first_contact_limit import FirstContactLimit

RELEASE_KEY = "compass.release_first_contact_place"  # scope key: gives the place up
ARRIVED_KEY = "compass.arrived_at"  # scope key: when the request reached the broker (monotonic)
_RUNTIME_PATH = re.compile(r"^/v1/runtimes/([^/]{1,64})/(?:token|connection)$")


def arrived_at(scope: Scope) -> float | None:
    """When a runtime request reached the broker, before any wait here (None: not stamped)."""
    arrived = scope.get(ARRIVED_KEY)
    return arrived if isinstance(arrived, float) else None


def release_first_contact_place(scope: Scope) -> Callable[[], None] | None:
    """The callable that gives this request's place up (None: it held none)."""
    release = scope.get(RELEASE_KEY)
    return release if callable(release) else None


@dataclass
class _RuntimeQueue:
    """One runtime's own queue: `share` of its requests go on to the shared queue at a time.
    Exists only while a request of that runtime is here."""

    share_places: asyncio.Semaphore
    present: int = 0  # requests of this runtime here: waiting or holding a share place


class FirstContactLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        capacity: int,
        is_known: Callable[[str], bool],
        per_runtime: int | None = None,
        max_wait: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """`is_known`: requests of such a runtime are not limited (they need no network to be
        checked: proven recently, or no Kyma at all). `per_runtime`: the places one runtime ID
        may hold at once (default: all of them)."""
        self._app = app
        self._places = asyncio.Semaphore(capacity)
        self._is_known = is_known
        self._share = max(1, min(per_runtime or capacity, capacity))
        self._runtime_queues: dict[str, _RuntimeQueue] = {}
        self._clock = clock
        self._on_refused = on_refused  # told the endpoint ("token" or "connection")
        self.limit = FirstContactLimit(capacity=capacity, max_wait=max_wait)
        self.waiting = 0  # parked in the shared queue now

    def runtime_queues(self) -> int:
        """Runtimes with a request here (for tests of the bound)."""
        return len(self._runtime_queues)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime_id = _runtime_of(scope)
        if runtime_id is not None:
            # The request's deadline counts from here (`arrived_at`): a wait in this queue is
            # part of the agent's timeout.
            scope[ARRIVED_KEY] = self._clock()
        if runtime_id is None or self._is_known(runtime_id):
            await self._app(scope, receive, send)
            return
        # A runtime's own queue first: however many requests one runtime ID sends, at most
        # `share` of them hold or wait for the places all runtimes share (docs/design/0003).
        key = runtime_id.lower()
        queue = self._runtime_queues.get(key)
        if queue is None:
            queue = self._runtime_queues[key] = _RuntimeQueue(
                share_places=asyncio.Semaphore(self._share)
            )
        wait = self.limit.own_queue_wait(present=queue.present, share=self._share)
        if wait is not None:
            await self._refuse(scope, send, wait)
            return
        queue.present += 1
        try:
            await self._within_share(queue, runtime_id, scope, receive, send)
        finally:
            queue.present -= 1
            if not queue.present:
                del self._runtime_queues[key]

    async def _within_share(
        self, queue: _RuntimeQueue, runtime_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            async with asyncio.timeout(2 * self.limit.max_wait):
                await queue.share_places.acquire()
        except TimeoutError:
            await self._refuse(scope, send, 1.0)
            return
        share_held = True

        def release_share() -> None:
            nonlocal share_held
            if share_held:
                share_held = False
                queue.share_places.release()

        try:
            if self._is_known(runtime_id):
                # Proven while it waited (another request of this runtime went first): no
                # check needs a place now.
                release_share()
                await self._app(scope, receive, send)
                return
            await self._shared(scope, receive, send, release_share)
        finally:
            release_share()

    async def _shared(
        self, scope: Scope, receive: Receive, send: Send, release_share: Callable[[], None]
    ) -> None:
        wait = self.limit.refusal_wait(ahead=self.waiting, now=self._clock())
        if wait is not None:
            await self._refuse(scope, send, wait)
            return
        self.waiting += 1
        try:
            async with asyncio.timeout(2 * self.limit.max_wait):
                await self._places.acquire()
        except TimeoutError:
            await self._refuse(scope, send, 1.0)
            return
        finally:
            self.waiting -= 1
        entered = self._clock()
        released = False
        measured = True

        def discount() -> None:
            nonlocal measured
            measured = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                if measured:
                    # A hold that ended in a runtime's timeout says nothing about the rate
                    # (docs/design/0004): one stalled runtime must not slow it for the fleet.
                    self.limit.observe(self._clock() - entered)
                self._places.release()
                release_share()

        hold = first_contact_limit.track_hold(discount)
        try:
            await self._app({**scope, RELEASE_KEY: release}, receive, send)
        finally:
            first_contact_limit.untrack_hold(hold)
            release()

    async def _refuse(self, scope: Scope, send: Send, wait: float) -> None:
        path = scope.get("path", "")
        busy = FirstContactsBusy(
            "more runtimes wait for their identity check than can be checked before they time out",
            retry_after=wait,
        )
        problem = problem_for(busy, instance=path, jitter_max=0.0, rand=random.random)
        note_problem(busy.slug)
        body = json.dumps(problem.body).encode()
        headers = [
            (b"content-type", MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            *((name.lower().encode(), value.encode()) for name, value in problem.headers.items()),
        ]
        await send({"type": "http.response.start", "status": problem.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self._on_refused is not None:
            self._on_refused(path.rsplit("/", 1)[-1])


def _runtime_of(scope: Scope) -> str | None:
    if scope["type"] != "http" or scope.get("method") != "POST":
        return None
    match = _RUNTIME_PATH.match(scope.get("path", ""))
    return match.group(1) if match else None
