"""The mw in front of the app: first contacts come in a few at a time, in arrival order, and
leave their place when their identity check is over; known runtimes and other paths pass."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from control_plane_broker.api.first_contact_middleware import (
    FirstContactLimitMiddleware,
    arrived_at,
    release_first_contact_place,
)
from control_plane_broker.errors import IdentityNotProven
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.verifier import CountingVerifier
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload.first_contact_limit import FirstContactLimit
from control_plane_broker.settings import Settings
from tests.unit.broker.conditions import until

RUNTIME = "5A3C7E0E-7E7B-4C1B-9E0E-8B8B1C6F0A11"


def http(path: str, method: str = "POST") -> Scope:
    return {"type": "http", "method": method, "path": path}


async def receive() -> Message:
    return {"type": "http.disconnect"}


async def send(_: Message) -> None:
    return None


class App:
    """Each request waits until the test lets it go; records who got in, in what order."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.go: dict[str, asyncio.Event] = {}
        self.leave: dict[str, Callable[[], None] | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"]
        self.inside.append(name)
        self.leave[name] = release_first_contact_place(scope)
        await self.go.setdefault(name, asyncio.Event()).wait()

    def release(self, name: str) -> None:
        self.go.setdefault(name, asyncio.Event()).set()


def token_path(i: int) -> str:
    return f"/v1/runtimes/{RUNTIME[:-2]}{i:02d}/token"


async def test_unknown_runtimes_come_in_a_few_at_a_time_in_arrival_order() -> None:
    app = App()
    mw = FirstContactLimitMiddleware(app, capacity=2, is_known=lambda _: False)
    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(mw(http(token_path(i)), receive, send)))
        await asyncio.sleep(0)  # arrival order is creation order
    await until(lambda: len(app.inside) == 2 and mw.waiting == 3)
    assert app.inside == [token_path(0), token_path(1)]
    # The first leaves its place when its identity check is over, still inside the app: the
    # next in line comes in although the first has not answered yet.
    leave = app.leave[token_path(0)]
    assert leave is not None
    leave()
    await until(lambda: len(app.inside) == 3)
    assert app.inside[2] == token_path(2)
    leave()  # a second call gives nothing more up
    for _ in range(10):  # turns of the loop, not time: a place given up lets one in within two
        await asyncio.sleep(0)
    assert len(app.inside) == 3
    assert mw.waiting == 2
    # The second ends without calling it: its place is given up at the end of the request.
    app.release(token_path(1))
    await until(lambda: len(app.inside) == 4)
    assert app.inside[3] == token_path(3)
    for i in range(5):
        app.release(token_path(i))
    await asyncio.gather(*tasks)
    assert app.inside == [token_path(i) for i in range(5)]
    assert mw.waiting == 0


async def test_a_request_that_fails_inside_gives_its_place_up() -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    mw = FirstContactLimitMiddleware(failing, capacity=1, is_known=lambda _: False)
    for _ in range(3):  # with the place lost, the second would wait forever
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(mw(http(token_path(0)), receive, send), timeout=1.0)


async def test_a_request_cancelled_while_waiting_leaves_no_place_taken() -> None:
    app = App()
    mw = FirstContactLimitMiddleware(app, capacity=1, is_known=lambda _: False)
    first = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: len(app.inside) == 1)
    waiting = asyncio.create_task(mw(http(token_path(1)), receive, send))
    await until(lambda: mw.waiting == 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert mw.waiting == 0
    app.release(token_path(0))
    await first
    third = asyncio.create_task(mw(http(token_path(2)), receive, send))
    await until(lambda: token_path(2) in app.inside)
    app.release(token_path(2))
    await third


async def test_known_runtimes_and_other_requests_pass_a_full_limit() -> None:
    app = App()
    known = f"{RUNTIME[:-2]}99"
    mw = FirstContactLimitMiddleware(
        app, capacity=1, is_known=lambda runtime_id: runtime_id == known
    )
    held = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: len(app.inside) == 1)
    walk_past = [
        http(f"/v1/runtimes/{known}/token"),
        http(f"/v1/runtimes/{known}/connection"),
        http("/healthz", method="GET"),
        http("/metrics", method="GET"),
        http(token_path(1), method="GET"),  # not the endpoint's method: the app answers it
    ]
    for scope in walk_past:
        app.release(scope["path"])
        await asyncio.wait_for(mw(scope, receive, send), timeout=1.0)
    assert mw.waiting == 0
    # They held no place: nothing to give up.
    assert all(app.leave[scope["path"]] is None for scope in walk_past)
    app.release(token_path(0))
    await held


async def test_a_report_of_an_unknown_runtime_waits_like_a_token_request() -> None:
    app = App()
    mw = FirstContactLimitMiddleware(app, capacity=1, is_known=lambda _: False)
    held = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: len(app.inside) == 1)
    report = f"/v1/runtimes/{RUNTIME}/connection"
    parked = asyncio.create_task(mw(http(report), receive, send))
    await until(lambda: mw.waiting == 1)
    assert report not in app.inside
    app.release(token_path(0))
    app.release(report)
    await asyncio.gather(held, parked)
    assert app.inside == [token_path(0), report]


class Proves:
    mode = "jwks"

    def __init__(self) -> None:
        self.ok = True

    async def verify(self, *, runtime_id: str, headers: object) -> Identity:
        if not self.ok:
            raise IdentityNotProven("no", reason="invalid")
        return Identity(runtime_id=runtime_id, subject="s", mode="jwks", expires_at=None)


async def test_the_verifier_remembers_who_proved_recently_and_only_them() -> None:
    now = [0.0]
    inner = Proves()
    verifier = CountingVerifier(
        inner, Metrics(), clock=lambda: now[0], remember_seconds=300.0, remember_at_most=2
    )
    assert not verifier.proved_recently("a")
    inner.ok = False
    with pytest.raises(IdentityNotProven):
        await verifier.verify(runtime_id="a", headers={})
    assert not verifier.proved_recently("a")  # a failed proof is no reason to pass
    inner.ok = True
    await verifier.verify(runtime_id="a", headers={})
    assert verifier.proved_recently("a")
    now[0] = 299.0
    assert verifier.proved_recently("a")
    now[0] = 300.0
    assert not verifier.proved_recently("a")  # keys may have been rotated since
    # Bounded: the oldest proof is forgotten first.
    for runtime in ("a", "b", "c"):
        await verifier.verify(runtime_id=runtime, headers={})
    assert [verifier.proved_recently(r) for r in ("a", "b", "c")] == [False, True, True]


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_a_first_contact_limit_without_places_or_a_garbled_size_is_refused_at_start(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKER_FIRST_CONTACTS_IN_PROGRESS", value)
    with pytest.raises(ValidationError, match="first_contacts_in_progress"):
        Settings()


def test_the_limit_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_FIRST_CONTACTS_IN_PROGRESS", "8")
    assert Settings().first_contacts_in_progress == 8
    monkeypatch.delenv("BROKER_FIRST_CONTACTS_IN_PROGRESS")
    assert Settings().first_contacts_in_progress == 64


def test_the_rate_lets_a_newcomer_wait_only_when_its_place_comes_within_max_wait() -> None:
    limit = FirstContactLimit(capacity=10, max_wait=5.0, hold=0.1)  # 100 a second
    assert limit.per_second() == pytest.approx(100.0)
    assert limit.refusal_wait(ahead=0, now=0.0) is None
    assert limit.refusal_wait(ahead=500, now=0.0) is None  # 5 s: just in time
    first = limit.refusal_wait(ahead=501, now=0.0)
    assert first == pytest.approx(5.01)
    # The refused are spread at the limit the mw lets them in, not sent back at once.
    second = limit.refusal_wait(ahead=501, now=0.0)
    third = limit.refusal_wait(ahead=501, now=0.0)
    assert second == pytest.approx(5.02)
    assert third == pytest.approx(5.03)
    # A line longer than what was promised puts the reservation behind that line.
    assert limit.refusal_wait(ahead=2_000, now=0.0) == pytest.approx(20.0)
    # Waits are bounded by the agent's longest backoff, however long the line.
    assert limit.refusal_wait(ahead=10**9, now=0.0) == pytest.approx(limit.longest_wait)
    # Promised waits are not reservations: once they are past, a short line lets one wait.
    assert limit.refusal_wait(ahead=3, now=400.0) is None


def test_the_rate_follows_how_long_a_place_is_held() -> None:
    limit = FirstContactLimit(capacity=32, max_wait=5.0, hold=0.1)
    for _ in range(100):
        limit.observe(0.4)
    assert limit.hold == pytest.approx(0.4, rel=1e-3)
    assert limit.per_second() == pytest.approx(80.0, rel=1e-3)
    # 80 a second for 5 s: the 401st in line would wait too long.
    assert limit.refusal_wait(ahead=399, now=0.0) is None
    assert limit.refusal_wait(ahead=401, now=0.0) is not None


class Answers:
    """What the mw sent: status, headers and the problem body."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> dict[str, object]:
        return dict(json.loads(self.messages[1]["body"]))


async def test_a_newcomer_behind_a_line_too_long_for_its_timeout_is_answered_at_once() -> None:
    app = App()
    refused: list[str] = []
    mw = FirstContactLimitMiddleware(
        app, capacity=1, is_known=lambda _: False, max_wait=1.5, on_refused=refused.append
    )
    # One place held 1 s: 1 a second; with 2 in line a newcomer would wait 2 s.
    mw.limit.hold = 1.0
    tasks = [asyncio.create_task(mw(http(token_path(0)), receive, send))]
    await until(lambda: len(app.inside) == 1)
    for i in (1, 2):
        tasks.append(asyncio.create_task(mw(http(token_path(i)), receive, send)))
        await until(lambda i=i: mw.waiting == i)  # type: ignore[misc]
    answers = Answers()
    await asyncio.wait_for(mw(http(token_path(3)), receive, answers), timeout=1.0)
    assert token_path(3) not in app.inside  # no work done for it
    assert answers.status == 503
    assert answers.headers["content-type"] == "application/problem+json"
    assert int(answers.headers["retry-after"]) >= 1
    assert str(answers.body["type"]).endswith(":first-contacts-busy")
    assert answers.body["instance"] == token_path(3)
    assert refused == ["token"]
    assert mw.waiting == 2  # the line is as it was
    for i in range(3):
        app.release(token_path(i))
    await asyncio.gather(*tasks)
    assert app.inside == [token_path(i) for i in range(3)]


async def test_a_newcomer_still_parked_after_twice_max_wait_is_answered_and_frees_nothing() -> None:
    app = App()
    mw = FirstContactLimitMiddleware(app, capacity=1, is_known=lambda _: False, max_wait=0.05)
    held = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: len(app.inside) == 1)
    answers = Answers()
    await asyncio.wait_for(mw(http(token_path(1)), receive, answers), timeout=1.0)
    assert answers.status == 503
    assert mw.waiting == 0
    assert token_path(1) not in app.inside
    # The place held inside is still held (the timeout took none): the next one waits for it.
    app.release(token_path(0))
    await held
    follower = asyncio.create_task(mw(http(token_path(2)), receive, send))
    await until(lambda: token_path(2) in app.inside)
    app.release(token_path(2))
    await follower


async def test_a_place_given_up_teaches_the_first_contact_limit_its_rate() -> None:
    now = [0.0]
    app = App()
    mw = FirstContactLimitMiddleware(
        app, capacity=1, is_known=lambda _: False, clock=lambda: now[0]
    )
    mw.limit.smoothing = 1.0
    task = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: len(app.inside) == 1)
    now[0] = 0.75
    app.release(token_path(0))
    await task
    assert mw.limit.hold == pytest.approx(0.75)


async def test_a_runtime_request_is_stamped_with_its_arrival_before_it_waits_here() -> None:
    """The request's deadline counts from this stamp (`issuing.token_issuer`): the wait in this
    queue is part of the agent's timeout."""
    clock = [50.0]
    seen: dict[str, float | None] = {}

    class Stamps(App):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            seen[scope["path"]] = arrived_at(scope)
            await super().__call__(scope, receive, send)

    app = Stamps()
    mw = FirstContactLimitMiddleware(
        app, capacity=1, is_known=lambda _: False, clock=lambda: clock[0]
    )
    first = asyncio.create_task(mw(http(token_path(0)), receive, send))
    await until(lambda: token_path(0) in seen)
    second = asyncio.create_task(mw(http(token_path(1)), receive, send))
    await until(lambda: mw.waiting == 1)
    clock[0] = 53.0  # the second waits for the first's place
    app.release(token_path(0))
    await first
    await until(lambda: token_path(1) in seen)
    assert seen == {token_path(0): 50.0, token_path(1): 50.0}
    app.release(token_path(1))
    await second
    app.release("/healthz")
    await mw(http("/healthz", "GET"), receive, send)  # not a runtime request: no stamp
    assert seen["/healthz"] is None
