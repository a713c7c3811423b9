"""Compass simulator, fault injection through HTTP: down (refuse / drop / 503),
latency, injected errors, lost responses, rate limits and bounded concurrency; the
admin API stays reachable throughout, and counters record every attempt."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator

import httpx
import pytest

from devenv.compass_sim import (
    CompassSimulator,
    ErrorCode,
    Faults,
    InjectedError,
    Latency,
    Outcome,
    RateLimit,
    SimConfig,
)
from devenv.compass_sim.operations import Endpoint
from devenv.compass_sim.testing import (
    CONNECTOR_CONFIGURATION,
    LIST_RUNTIMES,
    REGISTER_RUNTIME,
    REQUEST_ONE_TIME_TOKEN,
    DirectorClient,
    ManualClock,
    fetch_token,
)
from tests.integration.waiting import eventually

pytestmark = pytest.mark.timeout(60)

TENANT = "ga-1"
CLIENT_ID, CLIENT_SECRET = "fault-client", "fault-secret"


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    simulator = CompassSimulator(config, clock=clock, rng=random.Random(20240704))
    with simulator.running():
        yield simulator


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


@pytest.fixture
def director(sim: CompassSimulator, http: httpx.Client) -> DirectorClient:
    return DirectorClient(http, sim.director_url, token=sim.issue_access_token(), tenant=TENANT)


def _register(director: DirectorClient, name: str) -> httpx.Response:
    return director.post(REGISTER_RUNTIME, {"in": {"name": name}})


def _admin_reachable(url: str) -> None:
    # A fresh client: no pooled connection may hide a refusing listener.
    with httpx.Client(timeout=5) as client:
        assert client.get(f"{url}/_sim/health").json()["ok"] is True


def test_down_503_answers_every_compass_endpoint_with_retry_after(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    sim.update_faults(down="503", down_retry_after_seconds=30)
    responses = [
        director.post(LIST_RUNTIMES),
        http.post(sim.token_url, auth=(CLIENT_ID, CLIENT_SECRET), data={"grant_type": "x"}),
        http.post(sim.connector_url, json={"query": CONNECTOR_CONFIGURATION}),
    ]
    assert [r.status_code for r in responses] == [503, 503, 503]
    assert {r.headers["retry-after"] for r in responses} == {"30"}
    _admin_reachable(sim.url)
    _admin_reachable(sim.admin_url)
    assert sim.counter("runtimes").unavailable == 1
    assert sim.counter("oauthToken").attempts == 1

    sim.clear_faults()
    assert director.post(LIST_RUNTIMES).status_code == 200


def test_down_drop_closes_connections_without_an_answer(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(down="drop")
    with pytest.raises(httpx.TransportError):
        _register(director, "never")
    assert sim.runtimes() == []
    _admin_reachable(sim.url)
    [record] = sim.request_log(operation="registerRuntime")
    assert (record.outcome, record.http_status) == (Outcome.DROPPED, None)
    sim.clear_faults()
    assert _register(director, "later").status_code == 200


def test_down_refuse_closes_the_listener_and_reopens_it_on_the_same_port(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    port = sim.port
    assert director.post(LIST_RUNTIMES).status_code == 200  # a pooled connection exists
    sim.update_faults(down="refuse")
    assert not sim.listening
    with pytest.raises(httpx.TransportError):  # refused, or reset if the pool raced
        director.post(LIST_RUNTIMES)
    with pytest.raises(httpx.ConnectError), httpx.Client() as fresh:
        fresh.get(f"{sim.url}/_sim/health")
    _admin_reachable(sim.admin_url)
    assert sim.counter("runtimes").attempts == 1  # refused requests never arrive

    sim.clear_faults()
    assert sim.listening
    assert sim.port == port
    assert director.post(LIST_RUNTIMES).status_code == 200


def test_down_refuse_can_be_switched_through_the_admin_api(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    with httpx.Client(timeout=5) as admin:
        # Asked on the main listener itself: it answers, then stops listening.
        response = admin.put(f"{sim.url}/_sim/faults", json={"down": "refuse"})
        assert response.json()["down"] == "refuse"
        with pytest.raises(httpx.TransportError):
            director.post(LIST_RUNTIMES)
        with pytest.raises(httpx.ConnectError), httpx.Client() as fresh:
            fresh.get(f"{sim.url}/_sim/health")
        assert admin.get(f"{sim.admin_url}/_sim/health").json() == {
            "ok": True,
            "down": "refuse",
            "listening": False,
        }
        assert admin.delete(f"{sim.admin_url}/_sim/faults").json()["down"] is None
    assert director.post(LIST_RUNTIMES).status_code == 200


def test_initial_faults_apply_from_the_start(http: httpx.Client) -> None:
    config = SimConfig(client_id="id", client_secret="secret", initial_faults=Faults(down="refuse"))
    with CompassSimulator(config).running() as down_sim:
        with pytest.raises(httpx.ConnectError), httpx.Client() as fresh:
            fresh.post(down_sim.token_url)
        _admin_reachable(down_sim.admin_url)
        down_sim.clear_faults()
        response = http.post(
            down_sim.token_url,
            auth=("id", "secret"),
            data={"grant_type": "client_credentials", "scope": "runtime:read"},
        )
        assert response.status_code == 200


def test_latency_is_fixed_plus_jitter_and_limited_to_chosen_endpoints(
    sim: CompassSimulator,
    http: httpx.Client,
    director: DirectorClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    latency = Latency(fixed_seconds=0.2, jitter_seconds=0.1, endpoints=frozenset({"director"}))
    sim.update_faults(latency=latency)
    chosen: list[tuple[str, float]] = []  # each request's delay, as the simulator chose it
    choose = sim.faults_state.delay

    def delay(endpoint: Endpoint) -> float:
        seconds = choose(endpoint)
        chosen.append((endpoint, seconds))
        return seconds

    monkeypatch.setattr(sim.faults_state, "delay", delay)
    for _ in range(4):
        director.post(LIST_RUNTIMES)
    fetch_token(http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    assert [endpoint for endpoint, _ in chosen] == ["director"] * 4 + ["oauth"]
    delays = [seconds for _, seconds in chosen]
    assert all(0.2 <= d < 0.3 for d in delays[:4]), delays
    assert max(delays[:4]) - min(delays[:4]) > 0.002  # the jitter varies
    assert delays[4] == 0.0  # the token endpoint is not delayed
    # And each delay was served: a request took at least its delay, as the simulator measured
    # it (a lower bound only: a sleep never ends early, a busy machine only makes it longer).
    durations = [r.duration_seconds for r in sim.request_log(operation="runtimes")]
    assert all(took >= d - 0.001 for took, d in zip(durations, delays[:4], strict=True)), durations


def test_injected_graphql_error_is_not_executed_and_counted(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(
        errors=(
            InjectedError(
                operation="registerRuntime", error_code=ErrorCode.OPERATION_TIMEOUT, remaining=1
            ),
        )
    )
    failed = _register(director, "first-try")
    [error] = failed.json()["errors"]
    assert error["extensions"] == {"error_code": 28, "error": "OperationTimeout"}
    assert error["path"] == ["result"]
    assert sim.runtimes() == []
    assert sim.faults().errors == ()  # the counted fault is used up

    assert _register(director, "second-try").json()["data"]["result"]["name"] == "second-try"
    counter = sim.counter("registerRuntime")
    assert (counter.attempts, counter.successes, counter.errors) == (2, 1, 1)
    assert counter.injected_errors == 1
    assert [r.outcome for r in sim.request_log(operation="registerRuntime")] == [
        Outcome.INJECTED_ERROR,
        Outcome.OK,
    ]


def test_injected_errors_follow_their_rate(sim: CompassSimulator, director: DirectorClient) -> None:
    sim.update_faults(
        errors=(InjectedError(operation="*", error_code=ErrorCode.CONCURRENT_OPERATION, rate=0.5),)
    )
    codes = []
    for _ in range(40):
        errors = director.post(LIST_RUNTIMES).json().get("errors") or []
        codes.append(errors[0]["extensions"]["error_code"] if errors else None)
    failures = codes.count(32)
    assert 8 <= failures <= 32, codes
    assert codes.count(None) == 40 - failures
    assert sim.counter("runtimes").injected_errors == failures


def test_injected_http_status_rejects_the_whole_request(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    sim.update_faults(
        errors=(
            InjectedError(operation="registerRuntime", http_status=502),
            InjectedError(operation="oauthToken", error_code=ErrorCode.INTERNAL_ERROR),
        )
    )
    assert _register(director, "blocked").status_code == 502
    assert sim.runtimes() == []
    token = http.post(
        sim.token_url,
        auth=(CLIENT_ID, CLIENT_SECRET),
        data={"grant_type": "client_credentials", "scope": "runtime:read"},
    )
    assert (token.status_code, token.json()["error"]) == (500, "server_error")
    assert sim.counter("registerRuntime").injected_errors == 1
    assert sim.counter("oauthToken").injected_errors == 1


def test_lost_response_commits_the_mutation_then_answers_504(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(lost_responses={"registerRuntime": 1})
    invalid = _register(director, "not valid")  # failed calls do not use up the fault
    assert invalid.json()["errors"][0]["extensions"]["error_code"] == 22
    assert sim.faults().lost_responses == {"registerRuntime": 1}

    lost = _register(director, "lost-one")
    assert lost.status_code == 504
    [stored] = sim.runtimes(TENANT)
    assert stored.name == "lost-one"  # it happened, the caller just does not know
    assert sim.faults().lost_responses == {}
    assert _register(director, "next-one").status_code == 200
    counter = sim.counter("registerRuntime")
    assert (counter.attempts, counter.successes, counter.lost_responses) == (3, 2, 1)


def test_lost_response_can_drop_the_connection(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(lost_responses={"registerRuntime": 1}, lost_response_mode="drop")
    with pytest.raises(httpx.TransportError):
        _register(director, "dropped")
    assert [r.name for r in sim.runtimes()] == ["dropped"]
    [record] = sim.request_log(operation="registerRuntime")
    assert (record.outcome, record.http_status) == (Outcome.LOST_RESPONSE, None)


def test_lost_connector_response_still_consumes_the_token(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    runtime_id = _register(director, "agent").json()["data"]["result"]["id"]
    token = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})["token"]
    sim.update_faults(lost_responses={"configuration": 1})
    body = {"query": CONNECTOR_CONFIGURATION}
    headers = {"Connector-Token": token}
    assert http.post(sim.connector_url, json=body, headers=headers).status_code == 504
    retry = http.post(sim.connector_url, json=body, headers=headers)
    assert (retry.status_code, retry.content) == (400, b"")  # spent: it names no one now


def test_rate_limit_answers_429_with_retry_after(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, clock: ManualClock
) -> None:
    sim.update_faults(
        rate_limit=RateLimit(requests_per_second=1, burst=2, endpoints=frozenset({"director"}))
    )
    assert [director.post(LIST_RUNTIMES).status_code for _ in range(2)] == [200, 200]
    limited = director.post(LIST_RUNTIMES)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "1"
    fetch_token(http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    clock.advance(1)
    assert director.post(LIST_RUNTIMES).status_code == 200
    assert director.post(LIST_RUNTIMES).status_code == 429
    assert sim.counter("runtimes").rate_limited == 2

    sim.update_faults(rate_limit=RateLimit(requests_per_second=1, retry_after_seconds=17))
    director.post(LIST_RUNTIMES)
    assert director.post(LIST_RUNTIMES).headers["retry-after"] == "17"


async def _concurrent_lists(sim: CompassSimulator, count: int) -> float:
    token = sim.issue_access_token()
    headers = {"Authorization": f"Bearer {token}", "Tenant": TENANT}
    body = {"query": LIST_RUNTIMES}
    async with httpx.AsyncClient(timeout=10) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(client.post(sim.director_url, json=body, headers=headers) for _ in range(count))
        )
        elapsed = time.perf_counter() - started
    assert {r.status_code for r in responses} == {200}
    return elapsed


async def test_capacity_limit_queues_director_requests(sim: CompassSimulator) -> None:
    sim.update_faults(max_concurrent_director_requests=2, latency=Latency(fixed_seconds=0.2))
    elapsed = await _concurrent_lists(sim, 6)
    stats = sim.concurrency()
    assert stats.limit == 2
    assert stats.peak_active == 2
    assert stats.peak_in_flight > 2
    assert stats.waited >= 1
    assert elapsed >= 0.55  # three rounds of 0.2 s


async def test_without_capacity_limit_requests_run_in_parallel(sim: CompassSimulator) -> None:
    sim.update_faults(latency=Latency(fixed_seconds=0.2))
    await _concurrent_lists(sim, 6)
    stats = sim.concurrency()
    assert stats.limit is None
    assert stats.peak_active == stats.peak_in_flight > 2
    assert stats.waited == 0


async def test_raising_the_capacity_limit_releases_waiting_requests(
    sim: CompassSimulator,
) -> None:
    sim.update_faults(max_concurrent_director_requests=1, latency=Latency(fixed_seconds=1.0))
    task = asyncio.create_task(_concurrent_lists(sim, 4))
    await eventually(
        lambda: sim.concurrency().in_flight == 4, interval=0.01, what="one served, three waiting"
    )
    assert sim.concurrency().active == 1
    await asyncio.to_thread(sim.update_faults, max_concurrent_director_requests=None)
    await task
    # The three waiting were let in at once, while the first still held its slot (a second).
    assert sim.concurrency().peak_active == 4


def test_admin_api_sets_and_merges_faults(sim: CompassSimulator, http: httpx.Client) -> None:
    url = f"{sim.admin_url}/_sim/faults"
    put = http.put(url, json={"lost_responses": {"unregisterRuntime": 2}, "down": "503"})
    assert put.status_code == 200
    patched = http.patch(url, json={"down": None}).json()
    assert (patched["down"], patched["lost_responses"]) == (None, {"unregisterRuntime": 2})
    assert sim.faults().lost_responses == {"unregisterRuntime": 2}
    assert http.put(url, json={"lost_responses": {"registerRuntimes": 1}}).status_code == 422
    assert http.put(url, json={"latency": {"fixed_seconds": -1}}).status_code == 422
    assert http.put(url, json={"dwon": "503"}).status_code == 422
    assert http.get(url).json()["lost_responses"] == {"unregisterRuntime": 2}


def test_no_token_or_secret_shows_up_in_logs_or_admin_api(
    sim: CompassSimulator, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    access = fetch_token(http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    director = DirectorClient(http, sim.director_url, token=access, tenant=TENANT)
    runtime_id = director.result(REGISTER_RUNTIME, {"in": {"name": "secretive"}})["id"]
    ott = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})["token"]
    sim.update_faults(lost_responses={"configuration": 1})
    configuration = http.post(
        sim.connector_url, json={"query": CONNECTOR_CONFIGURATION}, headers={"Connector-Token": ott}
    )
    assert configuration.status_code == 504
    exposed = "\n".join(
        [
            caplog.text,
            *(
                http.get(f"{sim.admin_url}/_sim/{path}").text
                for path in ("requests", "counters", "tokens", "runtimes", "faults")
            ),
        ]
    )
    assert runtime_id in exposed  # the admin API did answer
    for secret in (access, ott, CLIENT_SECRET):
        assert secret not in exposed
    records = sim.request_log()
    assert [(r.operation, r.tenant) for r in records] == [
        ("oauthToken", None),
        ("registerRuntime", TENANT),
        ("requestOneTimeTokenForRuntime", TENANT),
        ("configuration", None),
    ]
