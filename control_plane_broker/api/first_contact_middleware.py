"""The first-contact limit in front of the runtime endpoints, as an ASGI middleware: requests of
runtimes the broker has not proven recently come into the app `capacity` at a time.

It parks those requests in arrival order, before FastAPI, where a parked request costs a task
and a few frames and no CPU. The place a request holds is in its ASGI scope
(`FirstContactHold`); the use case is told when the identity check is over (`identity_checked`,
given by the route): a token request gives its place up then, not when its answer is sent (a
connection report, which never waits for Director, at its end), so a request with a reservation
may wait for Director's capacity for seconds without holding a place; a check that ended because
a runtime's API server did not answer is not measured, whichever the endpoint.

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
from control_plane_broker.identity.verifier import IdentityChecked
from control_plane_broker.overload.first_contact_limit import FirstContactLimit

HOLD_KEY = "compass.first_contact_hold"  # scope key: the place the request holds
ARRIVED_KEY = "compass.arrived_at"  # scope key: when the request reached the broker (monotonic)
_RUNTIME_PATH = re.compile(r"^/v1/runtimes/([^/]{1,64})/(?:token|connection)$")


def arrived_at(scope: Scope) -> float | None:
    """When a runtime request reached the broker, before any wait here (None: not stamped)."""
    arrived = scope.get(ARRIVED_KEY)
    return arrived if isinstance(arrived, float) else None


@dataclass(frozen=True)
class FirstContactHold:
    """A request's place at the first-contact limit, as the app behind it sees it."""

    release: Callable[[], None]  # gives the place up (once: later calls do nothing)
    discount: Callable[[], None]  # its hold ended in a runtime's timeout: not a measure


def first_contact_hold(scope: Scope) -> FirstContactHold | None:
    """The place this request holds (None: it held none)."""
    hold = scope.get(HOLD_KEY)
    return hold if isinstance(hold, FirstContactHold) else None


def release_first_contact_place(scope: Scope) -> Callable[[], None] | None:
    """The callable that gives this request's place up (None: it held none)."""
    hold = first_contact_hold(scope)
    return hold.release if hold is not None else None


def identity_checked(scope: Scope, *, give_place_up: bool) -> IdentityChecked | None:
    """What the use case tells once the request's identity check is over: a check that timed
    out is left out of the measured rate (docs/design/0004); with `give_place_up` the place is
    given up then (a token request), otherwise at the request's end (a connection report).
    None when the request holds no place."""
    hold = first_contact_hold(scope)
    if hold is None:
        return None

    def checked(*, timed_out: bool) -> None:
        if timed_out:
            hold.discount()
        if give_place_up:
            hold.release()

    return checked


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

        hold = FirstContactHold(release=release, discount=discount)
        try:
            await self._app({**scope, HOLD_KEY: hold}, receive, send)
        finally:
            release()

    async def _refuse(self, scope: Scope, send: Send, wait: float) -> None:
        path = scope.get("path", "")
        busy = FirstContactsBusy(
            "more runtimes wait for their identity check than can be checked before they time out",
            retry_after=wait,
        )
        problem = problem_for(busy, instance=path, jitter_max=0.0, rand=random.random)
        note_problem(scope, busy.slug)
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
