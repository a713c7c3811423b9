"""The Director client against httpx.MockTransport: OAuth caching, Tenant header, error
classification, breaker and concurrency limit, paging; GraphQL documents against the real
schema."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from graphql import build_schema, parse, validate
from prometheus_client import generate_latest

from control_plane_broker.director import documents
from control_plane_broker.director.answers import RuntimeRegisterInput
from control_plane_broker.director.classification import (
    DirectorCredentialsRefused,
    DirectorInternal,
    DirectorPermanent,
    DirectorRetryable,
    DirectorTenantUnknown,
    may_have_written,
)
from control_plane_broker.director.graphql_client import MAX_PAGES, DirectorClient
from control_plane_broker.director.oauth import OAuthTokenSource, refresh_at
from control_plane_broker.errors import CallerGone, CapacityReserved, CompassUnavailable
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.director_limiter import DirectorLimiter
from control_plane_broker.settings import DirectorCredentials, load_director_credentials
from control_plane_broker.singleflight import SingleFlight
from tests.unit.broker.conditions import until
from tests.unit.broker.virtual_time import run_virtually

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMA = REPO_ROOT.parent / "shared" / "compass-api" / "director.graphql"
CREDS = DirectorCredentials("cid", "csecret", "https://oauth.test/oauth/token")
EMPTY_PAGE = {"pageInfo": {"hasNextPage": False, "endCursor": None}, "data": []}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeDirector:
    """Answers by operation name; records what it was sent."""

    def __init__(self) -> None:
        self.oauth_calls = 0
        self.calls: list[dict[str, Any]] = []
        self.answers: list[httpx.Response | Exception] = []
        self.expires_in = 300
        self.oauth_status = 200

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token":
            self.oauth_calls += 1
            if self.oauth_status != 200:
                return httpx.Response(self.oauth_status)
            assert request.headers["Authorization"].startswith("Basic ")
            assert b"grant_type=client_credentials" in request.content
            return httpx.Response(
                200, json={"access_token": f"at-{self.oauth_calls}", "expires_in": self.expires_in}
            )
        body = json.loads(request.content)
        self.calls.append({"headers": dict(request.headers), **body})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(
    fake: FakeDirector, clock: Clock, *, threshold: int = 3, max_concurrency: int = 4
) -> tuple[DirectorClient, DirectorLimiter, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=threshold, open_seconds=10),
        max_concurrency=max_concurrency,
        queue_timeout=0.2,
        clock=clock,
    )
    oauth = OAuthTokenSource(http, CREDS, scope="runtime:read runtime:write", clock=clock)
    return (
        DirectorClient(
            http=http, url="https://director.test/graphql", oauth=oauth, limiter=limiter
        ),
        limiter,
        http,
    )


def ok(data: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"data": data})


def gql_error(code: int) -> httpx.Response:
    return httpx.Response(
        200, json={"data": None, "errors": [{"message": "x", "extensions": {"error_code": code}}]}
    )


async def test_token_cached_and_tenant_header_sent() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [
        ok(
            {
                "requestOneTimeTokenForRuntime": {
                    "token": "ott",
                    "connectorURL": "https://connector.test/graphql",
                    "used": False,
                    "expiresAt": "t",
                }
            }
        )
    ] * 2
    ott = await client.request_one_time_token(tenant="ga-1", runtime_id="r1")
    await client.request_one_time_token(tenant="ga-1", runtime_id="r1")
    assert ott.token == "ott"
    assert "ott" not in repr(ott)
    assert fake.oauth_calls == 1
    assert fake.calls[0]["headers"]["tenant"] == "ga-1"
    assert fake.calls[0]["headers"]["authorization"] == "Bearer at-1"
    assert fake.calls[0]["variables"] == {"id": "r1"}
    # refreshed before expiry: at 300 s lifetime the margin is 60 s
    clock.now += 241
    fake.answers = [
        ok(
            {
                "requestOneTimeTokenForRuntime": {
                    "token": "o",
                    "connectorURL": "https://connector.test/graphql",
                }
            }
        )
    ]
    await client.request_one_time_token(tenant="ga-1", runtime_id="r1")
    assert fake.oauth_calls == 2
    await http.aclose()


def test_refresh_at() -> None:
    assert refresh_at(fetched_at=0, expires_in=3600) == 3540
    assert refresh_at(fetched_at=0, expires_in=100) == 80


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (httpx.Response(503), DirectorRetryable),
        (httpx.Response(429), DirectorRetryable),
        (httpx.ConnectError("boom"), DirectorRetryable),
        (gql_error(10), DirectorInternal),
        (gql_error(35), DirectorRetryable),
        (gql_error(22), DirectorPermanent),
        (gql_error(25), DirectorTenantUnknown),
    ],
)
async def test_errors_classified(
    answer: httpx.Response | Exception, error: type[Exception]
) -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [answer]
    with pytest.raises(error):
        await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
    await http.aclose()


async def test_unregister_missing_runtime_counts_as_done() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [gql_error(20), ok({"unregisterRuntime": {"id": "r"}})]
    assert await client.unregister_runtime(tenant="t", runtime_id="r") is False
    assert await client.unregister_runtime(tenant="t", runtime_id="r") is True
    await http.aclose()


async def test_breaker_opens_and_makes_no_call_until_probe() -> None:
    fake, clock = FakeDirector(), Clock()
    client, limiter, http = make(fake, clock, threshold=2)
    fake.answers = [httpx.Response(502), httpx.Response(502)]
    for _ in range(2):
        with pytest.raises(DirectorRetryable):
            await client.unregister_runtime(tenant="t", runtime_id="r")
    assert limiter.state is cb.State.OPEN
    sent = len(fake.calls)
    with pytest.raises(CompassUnavailable) as info:
        await client.unregister_runtime(tenant="t", runtime_id="r")
    assert not isinstance(info.value, DirectorRetryable)
    assert info.value.retry_after == pytest.approx(10)
    assert len(fake.calls) == sent  # nothing left the process
    clock.now += 10
    fake.answers = [ok({"unregisterRuntime": {"id": "r"}})]
    assert await client.unregister_runtime(tenant="t", runtime_id="r") is True
    assert limiter.state is cb.State.CLOSED
    await http.aclose()


async def test_breaker_metrics_tell_the_moment_it_opened_and_are_right_at_scrape_time() -> None:
    fake, clock = FakeDirector(), Clock()
    client, limiter, http = make(fake, clock, threshold=1)
    metrics = Metrics()
    limiter._on_state = metrics.on_breaker_state
    metrics.watch_breaker(limiter.refusing)
    sample = metrics.registry.get_sample_value
    assert sample("broker_circuit_breaker_opened_timestamp_seconds") == 0
    assert sample("broker_circuit_breaker_open") == 0
    before = time.time()
    fake.answers = [httpx.Response(503)]
    with pytest.raises(DirectorRetryable):
        await client.unregister_runtime(tenant="t", runtime_id="r")
    opened = sample("broker_circuit_breaker_opened_timestamp_seconds")
    assert opened is not None
    assert before <= opened <= time.time()
    assert sample("broker_circuit_breaker_open") == 1
    # The open period ends with no call arriving: the breaker would let the next one through,
    # and the gauge says so at once (it stayed 1 until a call came).
    clock.now += 10
    assert limiter.state is cb.State.OPEN
    assert sample("broker_circuit_breaker_open") == 0
    fake.answers = [ok({"unregisterRuntime": {"id": "r"}})]
    assert await client.unregister_runtime(tenant="t", runtime_id="r") is True
    assert sample("broker_circuit_breaker_open") == 0
    assert sample("broker_circuit_breaker_opened_timestamp_seconds") == opened
    await http.aclose()


async def test_permanent_errors_do_not_open_the_breaker() -> None:
    fake, clock = FakeDirector(), Clock()
    client, limiter, http = make(fake, clock, threshold=1)
    fake.answers = [gql_error(22)]
    with pytest.raises(DirectorPermanent):
        await client.unregister_runtime(tenant="t", runtime_id="r")
    assert limiter.state is cb.State.CLOSED
    await http.aclose()


async def test_concurrency_limit_bounds_calls_in_flight() -> None:
    in_flight = peak = 0
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        if request.url.path == "/oauth/token":
            return httpx.Response(200, json={"access_token": "a", "expires_in": 300})
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        return ok({"runtimes": EMPTY_PAGE})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=3, open_seconds=10),
        max_concurrency=2,
        queue_timeout=5,
        clock=Clock(),
    )
    oauth = OAuthTokenSource(http, CREDS, scope="s", clock=Clock())
    client = DirectorClient(http=http, url="https://d/graphql", oauth=oauth, limiter=limiter)
    tasks = [
        asyncio.create_task(client.runtimes_by_label(tenant="t", key="k", value="v"))
        for _ in range(6)
    ]
    await until(lambda: in_flight + limiter.snapshot().waiting == 6, what="all six calls asked")
    assert peak == 2
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 2
    await http.aclose()


async def test_runtimes_by_label_pages_and_filters_by_json_value() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    page = {
        "pageInfo": {"hasNextPage": True, "endCursor": "c1"},
        "data": [{"id": "a", "name": "n"}],
    }
    last = {
        "pageInfo": {"hasNextPage": False, "endCursor": "c2"},
        "data": [{"id": "b", "name": "n"}],
    }
    fake.answers = [ok({"runtimes": page}), ok({"runtimes": last})]
    found = await client.runtimes_by_label(tenant="t", key="kyma_runtime_id", value="RT-1")
    assert [r.id for r in found] == ["a", "b"]
    assert fake.calls[0]["variables"]["filter"] == [{"key": "kyma_runtime_id", "query": '"RT-1"'}]
    assert fake.calls[0]["variables"]["first"] == 100
    assert fake.calls[1]["variables"]["after"] == "c1"
    await http.aclose()


def test_single_flight_shares_one_execution() -> None:
    """On virtual time: the work's 0.05 s pass only once all 50 callers have asked."""
    flights: SingleFlight[int] = SingleFlight()
    runs = 0

    async def work() -> int:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.05)
        return 42

    async def callers() -> list[int]:
        return await asyncio.gather(*(flights.do("k", work) for _ in range(50)))

    assert run_virtually(callers()) == [42] * 50
    assert runs == 1
    assert not flights.in_flight("k")


def test_documents_valid_against_director_schema() -> None:
    if not SCHEMA.exists():
        pytest.skip(
            f"Director schema not found at ../shared/compass-api/director.graphql ({SCHEMA})"
        )
    schema = build_schema(SCHEMA.read_text())
    for name, text in documents.ALL_DOCUMENTS.items():
        problems = validate(schema, parse(text))
        assert not problems, f"{name}: {problems}"


@pytest.mark.parametrize(
    "text",
    [
        "data:\n  client_id: cid\n  client_secret: csecret\n  tokens_endpoint: https://o/t\n",
        json.dumps(
            {
                "data": {
                    "client_id": "cid",
                    "client_secret": "csecret",
                    "tokens_endpoint": "https://o/t",
                }
            }
        ),
    ],
)
def test_credentials_file_formats(tmp_path: Path, text: str) -> None:
    path = tmp_path / "creds"
    path.write_text(text)
    creds = load_director_credentials(path)
    assert (creds.client_id, creds.client_secret, creds.tokens_endpoint) == (
        "cid",
        "csecret",
        "https://o/t",
    )
    assert "csecret" not in repr(creds)


def test_credentials_file_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "creds"
    path.write_text("data: {client_id: a}\n")
    with pytest.raises(ValueError, match="client_secret"):
        load_director_credentials(path)


async def test_calls_queued_when_the_breaker_opens_do_not_reach_director() -> None:
    """An outage must not be followed by the queue that built up in it: no call leaves
    the process once the breaker is open, also none that waited for a slot."""
    clock = Clock()
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=1, open_seconds=30),
        max_concurrency=1,
        queue_timeout=5,
        clock=clock,
    )
    release = asyncio.Event()
    reached: list[str] = []

    async def failing() -> None:
        reached.append("first")
        await release.wait()
        raise DirectorRetryable("503")

    async def queued() -> None:
        reached.append("queued")

    first = asyncio.create_task(limiter.call(failing))
    await until(lambda: reached == ["first"], what="the first call to reach Director")
    second = asyncio.create_task(limiter.call(queued))  # admitted while closed, waits for a slot
    await until(lambda: limiter.snapshot().waiting == 1, what="the second call to queue")
    release.set()
    with pytest.raises(DirectorRetryable):
        await first
    with pytest.raises(CompassUnavailable, match="opened while the call waited") as refused:
        await second
    assert reached == ["first"]
    assert limiter.state is cb.State.OPEN
    assert refused.value.retry_after is not None
    assert 0 < refused.value.retry_after <= 30


async def test_a_call_whose_caller_hung_up_in_the_queue_does_not_reach_director() -> None:
    """A token nobody would receive is not requested: the check comes once the call holds its
    slot (the caller may leave at any time before), the slot goes to the next call at once, and
    Director's health is not judged by it."""
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=1, open_seconds=30),
        max_concurrency=1,
        queue_timeout=5,
        clock=Clock(),
    )
    release = asyncio.Event()
    reached: list[str] = []
    present = {"gone": True, "stayed": True}
    asked: list[str] = []

    def caller(name: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            asked.append(name)
            return present[name]

        return check

    async def work(name: str) -> str:
        reached.append(name)
        if name == "holder":
            await release.wait()
        return name

    holder = asyncio.create_task(limiter.call(lambda: work("holder")))
    await until(lambda: reached == ["holder"], what="the holder's call")
    gone = asyncio.create_task(limiter.call(lambda: work("gone"), caller_present=caller("gone")))
    stayed = asyncio.create_task(
        limiter.call(lambda: work("stayed"), caller_present=caller("stayed"))
    )
    await until(lambda: limiter._slots.waiting == 2, what="both calls queued behind the holder")
    present["gone"] = False  # hangs up while it waits
    release.set()
    assert await holder == "holder"
    with pytest.raises(CallerGone):
        await gone
    assert await stayed == "stayed"
    assert reached == ["holder", "stayed"]
    assert asked == ["gone", "stayed"]
    assert limiter.state is cb.State.CLOSED
    assert limiter._slots.waiting == 0


async def test_the_director_load_gauges_show_calls_in_flight_waiting_and_reserved_ahead() -> None:
    clock = Clock()
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=3, open_seconds=30),
        max_concurrency=1,
        queue_timeout=1,
        clock=clock,
    )
    metrics = Metrics()
    metrics.watch_director(limiter.snapshot)
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    calls = [asyncio.create_task(limiter.call(held)) for _ in range(3)]
    await until(lambda: limiter._slots.waiting == 2, what="two calls behind the first")
    for i in range(10):  # 10 · 0.1 s reserved at one slot: the last ones are deferred
        with contextlib.suppress(CapacityReserved):
            limiter.reserve(f"rt-{i}", calls=1)
    text = generate_latest(metrics.registry).decode()
    gauges = {
        name: float(value)
        for name, value in re.findall(r"^(broker_director_\w+) (\S+)$", text, re.MULTILINE)
        if "labels_synced" not in name and "credentials" not in name  # not load gauges
    }
    # Two calls queued: waits start 0.2 s ahead; 0.1 s each; admitted up to 1 s ahead, so
    # the ninth and tenth are deferred (reservations) and the schedule is reserved 1.2 s ahead.
    assert gauges == {
        "broker_director_calls_in_flight": 1.0,
        "broker_director_calls_waiting": 2.0,
        "broker_director_call_seconds_estimate": 0.1,
        "broker_director_booked_ahead_seconds": pytest.approx(1.2),
        "broker_director_tickets": 2.0,
        "broker_director_calendar_shift_seconds": 0.0,
        "broker_director_slot_timeouts_total": 0.0,
        "broker_director_late_calls_total": 0.0,
    }
    assert limiter.snapshot().reservations == limiter.schedule.reservations() > 0
    release.set()
    await asyncio.gather(*calls)
    assert (limiter.snapshot().in_flight, limiter.snapshot().waiting) == (0, 0)


async def test_a_call_that_finds_no_slot_in_time_is_refused_and_counted() -> None:
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=3, open_seconds=30),
        max_concurrency=1,
        queue_timeout=0.05,
        clock=Clock(),
    )
    metrics = Metrics()
    metrics.watch_director(limiter.snapshot)
    release = asyncio.Event()

    async def held() -> str:
        await release.wait()
        return "held"

    holder = asyncio.create_task(limiter.call(held))
    await until(lambda: limiter.snapshot().in_flight == 1, what="the slot taken")
    with pytest.raises(CompassUnavailable) as info:
        await limiter.call(held)  # waits 2 x 0.05 s for the only slot
    assert not isinstance(info.value, DirectorRetryable)
    assert limiter.snapshot().slot_timeouts == 1
    assert metrics.registry.get_sample_value("broker_director_slot_timeouts_total") == 1
    assert limiter.state is cb.State.CLOSED  # our own queue, no verdict on Director
    release.set()
    assert await holder == "held"


@pytest.mark.parametrize(
    ("breaker", "probe", "leaves", "wait"),
    [
        (cb.Breaker(), False, True, 0.0),
        (cb.Breaker(state=cb.State.OPEN, opened_at=100.0), False, False, 20.0),
        # While the probe is out, its verdict is due soon: ask again in a second.
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True), True, True, 1.0),
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True), False, False, 1.0),
        (cb.Breaker(state=cb.State.HALF_OPEN), True, True, 0.0),  # the next caller probes
    ],
)
def test_queued_call_rules(breaker: cb.Breaker, probe: bool, leaves: bool, wait: float) -> None:
    policy = cb.BreakerPolicy(failure_threshold=3, open_seconds=30)
    assert cb.may_leave_queue(breaker, probe=probe) is leaves
    assert cb.seconds_until_probe(breaker, policy, now=110.0) == wait


def test_callers_waiting_for_a_failed_oauth_fetch_share_its_failure() -> None:
    """In an outage, the callers queued behind one failing token fetch must not each call the
    token endpoint again, nor one arriving just after it; a caller arriving a second after that
    failure (half a second) does try again. On virtual time: the fetch's 0.05 s pass only once
    all eight callers have asked."""
    calls = 0
    answer = 503

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        if answer != 200:
            return httpx.Response(answer)
        return httpx.Response(200, json={"access_token": "a", "expires_in": 300})

    async def scenario() -> None:
        nonlocal answer
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        clock = Clock()
        source = OAuthTokenSource(http, CREDS, scope="s", clock=clock)
        results = await asyncio.gather(*(source.token() for _ in range(8)), return_exceptions=True)
        assert all(isinstance(r, DirectorRetryable) for r in results)
        assert calls == 1
        answer = 200
        clock.now += 0.4  # passed the breaker before the failure opened it: told the failure
        with pytest.raises(DirectorRetryable):
            await source.token()
        assert calls == 1
        clock.now += 0.1
        assert await source.token() == "a"
        assert calls == 2
        await http.aclose()

    run_virtually(scenario())


# --- Director's answers are input: validated at the edge -------------------------------------


def _page(data: object, *, more: bool = False, cursor: str | None = None) -> dict[str, Any]:
    return {"runtimes": {"pageInfo": {"hasNextPage": more, "endCursor": cursor}, "data": data}}


def _ott(token: object, url: object = "https://connector.test/graphql") -> dict[str, Any]:
    return {"requestOneTimeTokenForRuntime": {"token": token, "connectorURL": url}}


async def _call(client: DirectorClient, operation: str) -> object:
    if operation == "runtimes":
        return await client.runtimes_by_label(tenant="t", key="k", value="v")
    if operation == "registerRuntime":
        return await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
    return await client.request_one_time_token(tenant="t", runtime_id="r")


@pytest.mark.parametrize(
    ("operation", "data"),
    [
        ("runtimes", {"runtimes": "garbage"}),
        ("runtimes", {"runtimes": None}),
        ("runtimes", {}),
        ("runtimes", _page(5)),
        ("runtimes", _page([{"id": "a"}])),  # no name
        ("runtimes", _page([{"id": "has space", "name": "n"}])),  # not label-safe
        ("runtimes", {"runtimes": {"data": []}}),  # no pageInfo
        ("registerRuntime", {"registerRuntime": {"id": "-leading", "name": "n"}}),
        ("registerRuntime", {"registerRuntime": {"id": "a" * 64, "name": "n"}}),
        ("registerRuntime", {"registerRuntime": {"id": 'a"}', "name": "n"}}),
        ("registerRuntime", {"registerRuntime": None}),
        ("requestOneTimeTokenForRuntime", _ott("line\nbreak")),
        ("requestOneTimeTokenForRuntime", _ott("tab\tinside")),
        ("requestOneTimeTokenForRuntime", _ott("")),
        ("requestOneTimeTokenForRuntime", _ott(None)),
        ("requestOneTimeTokenForRuntime", _ott("x" * 8193)),
        ("requestOneTimeTokenForRuntime", _ott("ott", url="file:///etc/passwd")),
        ("requestOneTimeTokenForRuntime", _ott("ott", url="https://c.test/a b")),
        ("requestOneTimeTokenForRuntime", {"requestOneTimeTokenForRuntime": []}),
    ],
)
async def test_malformed_answers_are_compass_rejected(operation: str, data: object) -> None:
    fake, clock = FakeDirector(), Clock()
    client, limiter, http = make(fake, clock, threshold=1)
    fake.answers = [httpx.Response(200, json={"data": data})]
    with pytest.raises(DirectorPermanent) as info:
        await _call(client, operation)
    assert info.value.status == 502
    assert info.value.slug == "compass-rejected"
    assert str(info.value) == f"{operation}: unexpected answer from Director"
    assert "line\nbreak" not in str(info.value)
    assert limiter.state is cb.State.CLOSED  # Director answered: not an outage
    await http.aclose()


@pytest.mark.parametrize(
    "errors",
    ["boom", {"message": "x"}, 5, [1, 2], [{"message": {"nested": True}}], [None]],
)
async def test_a_malformed_errors_list_is_directors_failure(errors: object) -> None:
    # It says nothing about the runtime: 503 compass-unavailable, never a refusal.
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [httpx.Response(200, json={"data": None, "errors": errors})]
    with pytest.raises(DirectorInternal, match="malformed GraphQL error") as info:
        await client.unregister_runtime(tenant="t", runtime_id="r")
    assert info.value.status == 503
    await http.aclose()


async def test_well_formed_answers_pass_the_edge() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    uuid = "8f0e2b6c-1234-4abc-9def-0123456789ab"
    fake.answers = [
        ok({"registerRuntime": {"id": uuid, "name": "n", "labels": {"k": ["v"]}}}),
        ok(_ott("eyJ.x-y_z~", url="https://connector.test/graphql?x=1")),
    ]
    runtime = await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
    assert runtime.id == uuid
    ott = await client.request_one_time_token(tenant="t", runtime_id=uuid)
    assert (ott.token, ott.connector_url) == ("eyJ.x-y_z~", "https://connector.test/graphql?x=1")
    await http.aclose()


async def test_paging_is_bounded() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [
        ok(_page([{"id": f"r{i}", "name": "n"}], more=True, cursor=f"c{i}"))
        for i in range(MAX_PAGES + 1)
    ]
    with pytest.raises(DirectorPermanent, match="more pages"):
        await client.runtimes_by_label(tenant="t", key="k", value="v")
    assert len(fake.calls) == MAX_PAGES  # stopped asking, did not follow Director forever
    await http.aclose()


async def test_a_page_claiming_more_without_a_cursor_ends_the_listing() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [ok(_page([{"id": "a", "name": "n"}], more=True, cursor=None))]
    found = await client.runtimes_by_label(tenant="t", key="k", value="v")
    assert [r.id for r in found] == ["a"]
    assert len(fake.calls) == 1
    await http.aclose()


async def test_follow_up_token_request_goes_before_waiting_first_calls() -> None:
    """The token after a registration already holds Director's attention: it takes the next
    free slot before requests that have not started yet."""
    order: list[str] = []
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token":
            return httpx.Response(200, json={"access_token": "a", "expires_in": 300})
        body = json.loads(request.content)
        name = body["variables"].get("id") or body["variables"]["filter"][0]["query"]
        order.append(str(name))
        if name == "holder":
            await release.wait()
        if "requestOneTimeToken" in body["query"]:
            return ok(_ott("ott"))
        if "unregisterRuntime" in body["query"]:
            return ok({"unregisterRuntime": {"id": "x"}})
        return ok({"runtimes": EMPTY_PAGE})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=3, open_seconds=10),
        max_concurrency=1,
        queue_timeout=5,
        clock=Clock(),
    )
    oauth = OAuthTokenSource(http, CREDS, scope="s", clock=Clock())
    client = DirectorClient(http=http, url="https://d/graphql", oauth=oauth, limiter=limiter)
    holder = asyncio.create_task(client.unregister_runtime(tenant="t", runtime_id="holder"))
    await until(lambda: order == ["holder"], what="the holder's call")
    first = asyncio.create_task(client.runtimes_by_label(tenant="t", key="k", value="first"))
    follow = asyncio.create_task(
        client.request_one_time_token(tenant="t", runtime_id="follow", follow_up=True)
    )
    await until(lambda: limiter._slots.waiting == 2, what="both calls queued behind the holder")
    release.set()
    await asyncio.gather(holder, first, follow)
    assert order == ["holder", "follow", '"first"']
    await http.aclose()


SPEC = RuntimeRegisterInput(name="rt", labels={})


@pytest.mark.parametrize(
    ("answer", "written"),
    [
        (httpx.ConnectError("refused"), False),  # no connection: nothing left
        (httpx.ReadTimeout("slow"), True),  # sent, answer lost: Director may have done it
        (httpx.Response(503, text="down"), True),  # a 5xx may come after Director acted
        (httpx.Response(429), False),  # the front door's limit, before Director
        (gql_error(35), False),  # typed: returned before the commit, rolled back
        # Code 10 on the mutation's field: a COMMIT broken off answers that too.
        (gql_error(10), True),
    ],
)
async def test_a_failed_call_says_whether_it_may_have_written(
    answer: httpx.Response | Exception, written: bool
) -> None:
    fake, clock = FakeDirector(), Clock()
    uncertain: list[str] = []
    client, _, http = make(fake, clock)
    client._on_uncertain = lambda operation, _message: uncertain.append(operation)
    fake.answers = [answer]
    with pytest.raises(DirectorRetryable) as info:
        await client.register_runtime(tenant="t", spec=SPEC)
    assert info.value.maybe_written is written
    assert may_have_written(info.value) is written
    assert uncertain == (["registerRuntime"] if written else [])
    await http.aclose()


async def test_a_registration_committed_before_its_labels_failed_is_the_registration() -> None:
    # Director resolves `labels` in a transaction of its own after registerRuntime committed;
    # when that fails the answer carries the new runtime next to the field's error.
    fake, clock = FakeDirector(), Clock()
    uncertain: list[str] = []
    client, _, http = make(fake, clock)
    client._on_uncertain = lambda operation, _message: uncertain.append(operation)
    error = {
        "message": "Internal Server Error [errorID=e, reason: while committing transaction: "
        "driver: bad connection]",
        "path": ["registerRuntime", "labels"],
        "extensions": {"error_code": 10, "error": "InternalError"},
    }
    runtime = {"id": "0b5e5d1c-1", "name": "rt", "labels": None}
    fake.answers = [
        httpx.Response(200, json={"data": {"registerRuntime": runtime}, "errors": [error]})
    ]
    registered = await client.register_runtime(tenant="t", spec=SPEC)
    assert registered.id == "0b5e5d1c-1"
    assert uncertain == ["registerRuntime"]
    # The same partial answer to a read is not taken: its labels would look missing.
    fake.answers = [
        httpx.Response(
            200,
            json={
                "data": {"runtime": runtime},
                "errors": [{**error, "path": ["runtime", "labels"]}],
            },
        )
    ]
    with pytest.raises(DirectorInternal):
        await client.runtime(tenant="t", runtime_id="0b5e5d1c-1")
    assert uncertain == ["registerRuntime"]
    await http.aclose()


async def test_a_refused_bearer_is_the_brokers_credentials_not_the_runtimes() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [httpx.Response(401), httpx.Response(401)]
    with pytest.raises(DirectorCredentialsRefused) as info:
        await client.register_runtime(tenant="t", spec=SPEC)
    assert info.value.maybe_written is False
    assert fake.oauth_calls == 2  # a fresh access token was tried once
    await http.aclose()


async def test_no_access_token_means_nothing_was_sent() -> None:
    fake, clock = FakeDirector(), Clock()
    fake.oauth_status = 503
    client, _, http = make(fake, clock)
    with pytest.raises(DirectorRetryable) as info:
        await client.register_runtime(tenant="t", spec=SPEC)
    assert info.value.maybe_written is False
    assert fake.calls == []
    # The limiter's own refusals come before any call, too.
    assert may_have_written(CompassUnavailable("breaker open")) is False
    assert may_have_written(CapacityReserved("come back at your reservation")) is False
    assert may_have_written(CallerGone("hung up while the call waited")) is False
    # A typed error answer is given before the commit: Director rolled everything back.
    assert may_have_written(DirectorPermanent("refused")) is False
    # Director's internal error may hide a COMMIT that happened.
    assert may_have_written(DirectorInternal("internal error", maybe_written=True)) is True
    # Anything else (a bug, a cancellation) proves nothing.
    assert may_have_written(RuntimeError("bug")) is True
    await http.aclose()


class _Huge(httpx.AsyncByteStream):
    """A body of 64 MiB in 64 KiB chunks; counts what was read of it."""

    def __init__(self) -> None:
        self.served = 0

    async def __aiter__(self) -> Any:
        while self.served < 64 << 20:
            self.served += 65536
            yield b" " * 65536


async def test_an_oversized_director_answer_is_refused_unread() -> None:
    # Every body read from outside has a cap (issue 28, item 6): a huge answer is a failure of
    # that call (delivered: Director may have acted), never a broker over its memory limit.
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    huge = _Huge()
    fake.answers = [httpx.Response(200, stream=huge)]
    with pytest.raises(DirectorRetryable, match="exceeds") as caught:
        await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
    assert caught.value.maybe_written
    assert huge.served <= 8 << 20
    await http.aclose()


async def test_an_oversized_oauth_answer_is_refused_unread() -> None:
    huge = _Huge()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=huge)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    oauth = OAuthTokenSource(http, CREDS, scope="s", clock=Clock())
    with pytest.raises(DirectorRetryable, match="exceeds"):
        await oauth.token()
    assert huge.served <= 1 << 20
    await http.aclose()


async def test_a_transport_error_names_directors_server_and_the_cause() -> None:
    fake, clock = FakeDirector(), Clock()
    client, _, http = make(fake, clock)
    fake.answers = [httpx.ConnectError("[Errno 111] Connection refused")]
    with pytest.raises(DirectorRetryable) as caught:
        await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
    await http.aclose()
    assert str(caught.value) == (
        "registerRuntime: ConnectError (https://director.test): [Errno 111] Connection refused"
    )
