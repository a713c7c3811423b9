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

The line itself is bounded by time: an agent gives up after 30 s, and what waits at the door
still has Director's queue ahead of it (measured on a slower machine, cold start at N = 5,000:
the door let 135 first contacts a second through, the last of the herd waited past their timeout,
934 agents hung up and asked again, and with two replicas 600 one-time tokens were requested for
agents that had gone). So a newcomer whose place would come later than `max_wait` by the door's
measured pace is answered at once, before any work: 503 `first-contacts-busy` with a turn
(`Pace.turn_for`), the turns of the herd spread at the pace the door lets them through, so that
they come back about as fast as they can be let in. A request still parked after twice
`max_wait` (the pace was misjudged) is answered so too.

Fairness: no runtime ID holds more than `per_runtime` places (`BROKER_FIRST_CONTACTS_PER_RUNTIME`)
or waits in the shared line with more than that many requests: its others wait in a line of its
own, bounded by time the same way, so a runtime ID that floods the door (or whose cluster stalls)
delays only itself. Holds that ended in a runtime's timeout (`pacing.discount_hold`) are not
learned from.

Holds: every request that enters leaves its place exactly once (the use case's call, or the end
of the request, whichever is first), also when it fails or its client hangs up, or is answered at
the door without having entered; other paths and methods are never held; at most `capacity`
unknown callers are inside at once; by the measured pace none waits at the door longer than
`max_wait`, and none longer than twice that.
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

LEAVE_KEY = "compass.leave_door"  # scope key of the callable that gives the place up
_RUNTIME_PATH = re.compile(r"^/v1/runtimes/([^/]{1,64})/(?:token|connection)$")


def leave_door(scope: Scope) -> Callable[[], None] | None:
    """The callable that gives this request's place at the door up (None: it held none)."""
    leave = scope.get(LEAVE_KEY)
    return leave if callable(leave) else None


@dataclass
class Pace:
    """How fast the door lets first contacts in, and the turns of those it sends away. Pure."""

    capacity: int
    max_wait: float
    hold: float = 0.1  # seconds a place is held: a first guess, then measured
    smoothing: float = 0.1
    promised_until: float = 0.0  # where the last turn promised to a refused newcomer ends
    longest_turn: float = 300.0  # the agent's longest backoff: no turn further out than that

    def per_second(self) -> float:
        return self.capacity / max(self.hold, 1e-3)

    def turn_for(self, *, ahead: int, now: float) -> float | None:
        """None: the newcomer waits in line (its place comes within `max_wait`). Otherwise the
        seconds until its turn: after the line in front of it and after every turn promised
        before, one place's worth apart, so that the refused come back at the door's pace.
        Turns are promised, not reserved: a newcomer who comes back finds the line as it is."""
        wait = ahead / self.per_second()
        if wait <= self.max_wait:
            return None
        turn = min(max(self.promised_until, now + wait), now + self.longest_turn)
        self.promised_until = turn + 1 / self.per_second()
        return turn - now

    def observe(self, held_seconds: float) -> None:
        self.hold += self.smoothing * (max(held_seconds, 0.0) - self.hold)


@dataclass
class _Line:
    """One runtime's own line at the door: `share` of its requests go on to the shared line at
    a time. Exists only while a request of that runtime is at the door."""

    turns: asyncio.Semaphore
    present: int = 0  # requests of this runtime at the door: waiting or holding a turn


class Door:
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
        """`is_known`: requests of such a runtime walk past (they need no network to be
        checked: proven recently, or no Kyma at all). `per_runtime`: the places one runtime ID
        may hold at once (default: all of them)."""
        self._app = app
        self._places = asyncio.Semaphore(capacity)
        self._is_known = is_known
        self._share = max(1, min(per_runtime or capacity, capacity))
        self._lines: dict[str, _Line] = {}
        self._clock = clock
        self._on_refused = on_refused  # told the endpoint ("token" or "connection")
        self.pace = Pace(capacity=capacity, max_wait=max_wait)
        self.waiting = 0  # parked in the shared line now

    def lines(self) -> int:
        """Runtimes with a request at the door (for tests of the bound)."""
        return len(self._lines)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime_id = _runtime_of(scope)
        if runtime_id is None or self._is_known(runtime_id):
            await self._app(scope, receive, send)
            return
        # A runtime's own line first: however many requests one runtime ID sends (48 attackers
        # on a stalled runtime held every place for 10 s each), at most `share` of them hold or
        # wait for the places all runtimes share. Its line is bounded by time like the shared
        # one: a request that would not get its turn within `max_wait` is answered at once.
        key = runtime_id.lower()
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line(turns=asyncio.Semaphore(self._share))
        ahead = line.present - self._share + 1
        if ahead > 0 and ahead * self.pace.hold / self._share > self.pace.max_wait:
            await self._refuse(scope, send, ahead * self.pace.hold / self._share)
            return
        line.present += 1
        try:
            await self._own_turn(line, runtime_id, scope, receive, send)
        finally:
            line.present -= 1
            if not line.present:
                del self._lines[key]

    async def _own_turn(
        self, line: _Line, runtime_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            async with asyncio.timeout(2 * self.pace.max_wait):
                await line.turns.acquire()
        except TimeoutError:
            await self._refuse(scope, send, 1.0)
            return
        turn_held = True

        def end_turn() -> None:
            nonlocal turn_held
            if turn_held:
                turn_held = False
                line.turns.release()

        try:
            if self._is_known(runtime_id):
                # Proven while it waited (another request of this runtime went first): no
                # check needs a place now.
                end_turn()
                await self._app(scope, receive, send)
                return
            await self._shared(scope, receive, send, end_turn)
        finally:
            end_turn()

    async def _shared(
        self, scope: Scope, receive: Receive, send: Send, end_turn: Callable[[], None]
    ) -> None:
        turn = self.pace.turn_for(ahead=self.waiting, now=self._clock())
        if turn is not None:
            await self._refuse(scope, send, turn)
            return
        self.waiting += 1
        try:
            async with asyncio.timeout(2 * self.pace.max_wait):
                await self._places.acquire()
        except TimeoutError:
            await self._refuse(scope, send, 1.0)
            return
        finally:
            self.waiting -= 1
        entered = self._clock()
        left = False
        measured = True

        def discount() -> None:
            nonlocal measured
            measured = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                if measured:
                    # A hold that ended in a runtime's timeout says nothing about the pace
                    # (`pacing`): one stalled runtime must not slow the door for the fleet.
                    self.pace.observe(self._clock() - entered)
                self._places.release()
                end_turn()

        hold = first_contact_limit.holding(discount)
        try:
            await self._app({**scope, LEAVE_KEY: leave}, receive, send)
        finally:
            first_contact_limit.released(hold)
            leave()

    async def _refuse(self, scope: Scope, send: Send, turn: float) -> None:
        path = scope.get("path", "")
        busy = FirstContactsBusy(
            "more runtimes wait for their identity check than can be checked before they time out",
            retry_after=turn,
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
