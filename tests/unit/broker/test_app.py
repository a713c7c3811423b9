"""The HTTP surface in process (ASGI): readiness and liveness as the process reports them,
runtime IDs are checked before anything is looked up, and every error, routing errors and bugs
included, is a problem (never a bare 500)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from control_plane_broker.api.access import AccessLog, access_level, request_id_from
from control_plane_broker.api.app import (
    ConnectionReportBody,
    Health,
    answered_as_problem,
    create_app,
    report_from_body,
)
from control_plane_broker.connections.report_service import ConnectionReporter
from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    IdentityNotProven,
    InternalError,
    RateLimited,
)
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.issuing.token_issuer import TokenIssuer
from control_plane_broker.kube.caches import kyma_informer
from control_plane_broker.kyma import KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.registration.state import to_rfc3339
from control_plane_broker.settings import Settings
from kubeapi import ClusterAccess, KubeClient, KubeUnavailable, describe_transport_error
from observability.logs import JsonFormatter
from tests.integration.waiting import eventually
from tests.unit.broker.virtual_time import VirtualLoop

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
SECRET_TEXT = "eyJhbGciOiJSUzI1NiJ9.caller-input"


class Untouchable:
    """Stands in for every collaborator that must not be reached; records any attempt."""

    def __init__(self, name: str, touched: list[str]) -> None:
        self._name = name
        self._touched = touched

    def __getattr__(self, attr: str) -> Any:
        self._touched.append(f"{self._name}.{attr}")
        raise AssertionError(f"{self._name}.{attr} reached")


class Cache:
    def __init__(self, touched: list[str]) -> None:
        self.synced = False
        self._touched = touched

    def get(self, name: str) -> None:
        self._touched.append(f"cache.get({name})")


@dataclass
class World:
    client: httpx.AsyncClient
    cache: Cache
    touched: list[str]
    live: list[bool] = field(default_factory=lambda: [True])
    degraded: list[str] = field(default_factory=list)


def proof_with(cache: Any, touched: list[str], given: dict[str, Any]) -> RuntimeProof:
    """The chain that proves a runtime, over `cache`; its verifier and gate from `given`
    (taken out of it), else untouchable."""
    return RuntimeProof(
        cache=cache,
        verifier=given.pop("verifier", None) or Untouchable("verifier", touched),
        gate=given.pop("gate", None) or Untouchable("gate", touched),
        module=Settings().module_name,
        module_required=Settings().module_policy == "required",
    )


def issuer_with(cache: Any, touched: list[str], **given: Any) -> TokenIssuer:
    proof = proof_with(cache, touched, given)
    parts: dict[str, Any] = {
        name: Untouchable(name, touched)
        for name in ("registration", "director", "director_limiter", "status", "limiter")
    }
    parts |= given
    return TokenIssuer(
        request_deadline_seconds=Settings().request_deadline_seconds,
        proof=proof,
        clock=lambda: 0.0,
        **parts,
    )


def reporter_with(cache: Any, touched: list[str], **given: Any) -> ConnectionReporter:
    proof = proof_with(cache, touched, given)
    parts: dict[str, Any] = {
        name: Untouchable(name, touched) for name in ("mappings", "status", "limiter")
    }
    parts |= given
    return ConnectionReporter(
        settings=Settings().report_settings(),
        proof=proof,
        clock=lambda: 0.0,
        wall=lambda: 0.0,
        **parts,
    )


@pytest.fixture
async def world() -> AsyncIterator[World]:
    touched: list[str] = []
    cache = Cache(touched)
    live = [True]
    degraded: list[str] = []

    def ready() -> tuple[bool, list[str]]:
        return cache.synced, [] if cache.synced else ["kymas not synced"]

    app = create_app(
        issuer=issuer_with(cache, touched),
        reporter=reporter_with(cache, touched),
        metrics=Metrics(),
        health=Health(ready=ready, live=lambda: live[0], degraded=lambda: list(degraded)),
        jitter_max=2,
        rand=lambda: 0.5,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        yield World(client, cache, touched, live, degraded)


def kind(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


async def test_readyz_and_token_wait_for_the_cache(world: World) -> None:
    client, cache, touched = world.client, world.cache, world.touched
    r = await client.get("/readyz")
    assert r.status_code == 503
    assert r.json() == {"status": "not ready", "problems": ["kymas not synced"], "degraded": []}
    r = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "Bearer x"})
    assert (r.status_code, kind(r)) == (503, "not-ready")
    assert r.headers["Retry-After"] == "3"  # 2 s + half of the 2 s jitter
    assert touched == []
    cache.synced = True
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "problems": [], "degraded": []}
    world.degraded.append("Director's OAuth token endpoint refuses the broker's credentials")
    r = await client.get("/readyz")
    # Reported, never failing readiness: every replica shares the credentials, and a Service
    # without ready replicas would turn the whole fleet away (api.app.Health).
    assert r.status_code == 200
    assert r.json() == {
        "status": "ready",
        "problems": [],
        "degraded": ["Director's OAuth token endpoint refuses the broker's credentials"],
    }


async def test_healthz_fails_once_the_loop_was_wedged(world: World) -> None:
    r = await world.client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    world.live[0] = False
    r = await world.client.get("/healthz")
    assert (r.status_code, r.json()) == (503, {"status": "wedged"})
    assert world.touched == []


@pytest.mark.parametrize(
    "runtime_id", ["a" * 64, "-leading", "trailing-", "under_score", "dot.ted", "q%22uote"]
)
async def test_malformed_runtime_id_is_refused_before_any_lookup(
    world: World, runtime_id: str
) -> None:
    world.cache.synced = True
    r = await world.client.post(f"/v1/runtimes/{runtime_id}/token", headers={"Authorization": "x"})
    assert (r.status_code, kind(r)) == (400, "malformed-request")
    assert world.touched == []  # not the cache, not the verifier, not Director


async def test_routing_errors_are_problems_too(world: World) -> None:
    client, touched = world.client, world.touched
    r = await client.post("/v1/runtimes/a/b/token")
    assert (r.status_code, kind(r)) == (404, "not-found")
    r = await client.get("/v1/runtimes/rt-1/token")
    assert (r.status_code, kind(r)) == (405, "method-not-allowed")
    assert touched == []


class Exploding:
    """A verifier with a bug: fails with a message that quotes the caller's input."""

    mode = "test"

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Any:
        raise ValueError(f"cannot parse {SECRET_TEXT}")


def exploding_app(touched: list[str]) -> Any:
    cache = Cache(touched)
    cache.synced = True
    return create_app(
        issuer=issuer_with(cache, touched, verifier=Exploding()),
        reporter=reporter_with(cache, touched, verifier=Exploding()),
        metrics=Metrics(),
        health=Health(ready=lambda: (True, []), live=lambda: True),
        jitter_max=0,
    )


async def test_a_bug_is_answered_as_a_retryable_problem_without_its_text() -> None:
    touched: list[str] = []
    # The server side of the transport keeps what escapes the app to itself (uvicorn logs it).
    transport = httpx.ASGITransport(app=exploding_app(touched), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        r = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "Bearer x"})
    assert (r.status_code, kind(r)) == (503, "internal-error")
    assert r.headers["Retry-After"] == "5"
    assert SECRET_TEXT not in r.text
    assert touched == []  # the bug came before anything else was asked


async def test_a_bug_ends_inside_the_app(caplog: pytest.LogCaptureFixture) -> None:
    touched: list[str] = []
    transport = httpx.ASGITransport(app=exploding_app(touched))  # raises what escapes the app
    caplog.set_level(logging.INFO, logger="control_plane_broker.access")
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        r = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "Bearer x"})
    assert r.status_code == 503
    lines = [rec for rec in caplog.records if rec.msg == "request"]
    assert [getattr(rec, "status", None) for rec in lines] == [503]
    assert [getattr(rec, "retry_after", None) for rec in lines] == ["5"]  # when it comes back
    assert SECRET_TEXT not in caplog.text


def outcomes(counter: Any) -> dict[str, float]:
    return {
        sample.labels["outcome"]: sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.value
    }


def test_a_route_counts_its_refusals_and_makes_a_bug_a_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    with pytest.raises(RateLimited), answered_as_problem(metrics.connection_reports):
        raise RateLimited("too often", retry_after=3)
    caplog.set_level(logging.ERROR, logger="control_plane_broker.access")
    with pytest.raises(InternalError) as bug, answered_as_problem(metrics.connection_reports):
        raise ValueError(f"cannot parse {SECRET_TEXT}")
    assert bug.value.retry_after == 5
    assert bug.value.__suppress_context__  # the bug's text does not travel with the problem
    assert outcomes(metrics.connection_reports) == {"rate-limited": 1, "internal-error": 1}
    assert outcomes(metrics.token_requests) == {}
    assert [(r.msg, getattr(r, "error", None)) for r in caplog.records] == [
        ("unexpected error", "ValueError")
    ]
    assert SECRET_TEXT not in caplog.text


# --- the Kyma view readiness waits for -------------------------------------------------------


def kcp_client(handler: Any) -> KubeClient:
    return KubeClient(
        ClusterAccess(server="https://kcp.test"),
        user_agent="test",
        transport=httpx.MockTransport(handler),
    )


async def test_kyma_view_is_synced_only_after_a_complete_list() -> None:
    lists: list[str] = []
    kyma = {"metadata": {"name": "rt-1", "resourceVersion": "4", "uid": "u"}}

    def kcp(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            return httpx.Response(503, json={"message": "later"})  # re-lists after a pause
        lists.append(request.url.path)
        if len(lists) == 1:
            return httpx.Response(500, json={"message": "etcd unavailable"})
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": [kyma]})

    client = kcp_client(kcp)
    view = kyma_informer(client, namespace="kcp-system", delay=lambda _: 0.05)
    assert not view.synced
    task = asyncio.create_task(view.run())
    try:
        await eventually(lambda: view.synced, within=5, interval=0.01, what="the view synced")
        assert len(lists) >= 2  # the failed list did not count as synced
        assert lists[0] == "/apis/operator.kyma-project.io/v1beta2/namespaces/kcp-system/kymas"
        assert view.get("rt-1") == KymaView(
            name="rt-1", namespace="", uid="u", resource_version="4"
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()


def test_kyma_view_does_not_spin_on_watch_streams_that_end_at_once() -> None:
    """On virtual time (tests/unit/broker/virtual_time.py): a watch that ends at once is
    followed by the delay, so in 1.05 s with a delay of 0.1 s the view watches at 0, 0.1, ...,
    1.0 s: 11 times, each end followed by one more quick end counted for the delay."""
    watches: list[int] = []
    asked: list[int] = []

    def kcp(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            watches.append(1)
            if len(watches) > 100:  # spinning: virtual time stands still, so end it here
                raise AssertionError("the view spins on watch streams")
            return httpx.Response(200, text="")  # ends at once, no events
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": []})

    def delay(quick_ends: int) -> float:
        asked.append(quick_ends)
        return 0.1

    async def scenario() -> None:
        client = kcp_client(kcp)
        view = kyma_informer(client, namespace="kcp-system", delay=delay)
        task = asyncio.create_task(view.run())
        try:
            await asyncio.sleep(1.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    loop = VirtualLoop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert len(watches) == 11  # paced by the delay, not thousands
    assert asked == list(range(1, 12))


# --- the connection report endpoint ------------------------------------------------------------

GOOD_REPORT = {"connectionState": "Connected", "observedAt": "2026-12-03T15:00:00Z"}


@pytest.mark.parametrize(
    "body",
    [
        {**GOOD_REPORT, "extra": 1},  # unknown fields are refused
        {**GOOD_REPORT, "connectionState": "Happy"},
        {"connectionState": "Connected"},  # observedAt required
        {**GOOD_REPORT, "observedAt": 1764774000},  # a number is no RFC 3339 time
        {**GOOD_REPORT, "observedAt": "2026-12-03T15:00:00"},  # no offset
        {**GOOD_REPORT, "certificateNotAfter": "tomorrow"},
        {**GOOD_REPORT, "certificateNotAfter": "5449"},  # pydantic alone takes it for Unix time
        {**GOOD_REPORT, "observedAt": "1764774000"},
        {**GOOD_REPORT, "observedAt": "2026-12-03 15:00:00Z"},  # RFC 3339 wants the T
        {**GOOD_REPORT, "observedAt": "2026-12-03T15:00Z"},  # and the seconds
        {**GOOD_REPORT, "observedAt": "2026-13-03T15:00:00Z"},
        {**GOOD_REPORT, "lastError": "e" * 1025},
        {**GOOD_REPORT, "tokenSha256": "A" * 64},  # lower-case hex only
        {**GOOD_REPORT, "tokenSha256": "a" * 63},
        [GOOD_REPORT],
        "Connected",
    ],
)
async def test_a_malformed_report_is_refused_before_any_lookup(world: World, body: Any) -> None:
    world.cache.synced = True
    r = await world.client.post(
        "/v1/runtimes/rt-1/connection", json=body, headers={"Authorization": SECRET_TEXT}
    )
    assert (r.status_code, kind(r)) == (400, "malformed-request")
    assert SECRET_TEXT not in r.text
    assert world.touched == []


async def test_a_report_over_4_kib_is_refused_without_reading_it_all(world: World) -> None:
    world.cache.synced = True
    padded = {**GOOD_REPORT, "lastError": "e" * 1000, "x": " " * 4000}
    r = await world.client.post("/v1/runtimes/rt-1/connection", json=padded)
    assert (r.status_code, kind(r)) == (400, "malformed-request")
    assert "4096" in r.json()["detail"]

    async def endless() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        for _ in range(1000):
            yield b" " * 1024

    r = await world.client.post("/v1/runtimes/rt-1/connection", content=endless())
    assert (r.status_code, kind(r)) == (400, "malformed-request")
    assert world.touched == []


async def test_a_valid_report_waits_for_the_cache_like_a_token(world: World) -> None:
    r = await world.client.post(
        "/v1/runtimes/rt-1/connection", json=GOOD_REPORT, headers={"Authorization": "Bearer x"}
    )
    assert (r.status_code, kind(r)) == (503, "not-ready")
    assert world.touched == []
    r = await world.client.post("/v1/runtimes/a_b/connection", json=GOOD_REPORT)
    assert (r.status_code, kind(r)) == (400, "malformed-request")


def app_with_docs(*, api_docs: bool) -> Any:
    cache = Cache([])
    return create_app(
        issuer=issuer_with(cache, []),
        reporter=reporter_with(cache, []),
        metrics=Metrics(),
        health=Health(ready=lambda: (True, []), live=lambda: True),
        jitter_max=0,
        api_docs=api_docs,
    )


async def openapi() -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app_with_docs(api_docs=True))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        r = await client.get("/openapi.json")
    assert r.status_code == 200
    spec: dict[str, Any] = r.json()
    return spec


@pytest.mark.parametrize("api_docs", [False, True])
async def test_api_documentation_is_off_by_default_and_never_a_page_with_scripts(
    api_docs: bool,
) -> None:
    transport = httpx.ASGITransport(app=app_with_docs(api_docs=api_docs))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            r = await client.get(path)
            assert (r.status_code, kind(r)) == (404, "not-found"), path
            assert "<script" not in r.text
        r = await client.get("/openapi.json")
    if api_docs:
        assert r.headers["content-type"] == "application/json"
        assert "/v1/runtimes/{runtimeID}/token" in r.json()["paths"]
    else:
        assert (r.status_code, kind(r)) == (404, "not-found")


async def test_without_the_setting_no_api_description_is_served(world: World) -> None:
    assert Settings().api_docs is False
    r = await world.client.get("/openapi.json")  # an app made without api_docs
    assert (r.status_code, kind(r)) == (404, "not-found")


async def test_the_report_endpoint_is_in_the_openapi_with_its_body() -> None:
    spec = await openapi()
    operation = spec["paths"]["/v1/runtimes/{runtimeID}/connection"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"connectionState", "observedAt"}
    assert set(operation["responses"]) >= {"202", "400", "401", "403", "404", "409", "429", "503"}
    assert "502" not in operation["responses"]  # a report never reaches Director


@pytest.mark.parametrize(
    ("text", "recorded"),
    [
        ("2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        ("2027-01-01T01:30:00.999+01:30", "2027-01-01T00:00:00Z"),
        ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z"),  # clamped, not refused
        ("9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59Z"),
        ("1969-07-20T20:17:40Z", "1969-07-20T20:17:40Z"),
        ("2027-01-01t00:00:00.1234567z", "2027-01-01T00:00:00Z"),  # lower case, 7 digits
    ],
)
def test_any_valid_time_in_a_report_is_recorded_as_rfc3339_utc(text: str, recorded: str) -> None:
    body = ConnectionReportBody.model_validate_json(
        json.dumps(
            {"connectionState": "Connected", "observedAt": text, "certificateNotAfter": text}
        )
    )
    report = report_from_body(body)
    assert report.certificate_not_after == recorded
    assert to_rfc3339(report.observed_at) == recorded


# --- the access log and the request ID -------------------------------------------------------


class Chatty:
    """A verifier that logs a line of its own and refuses: a line written below the app."""

    mode = "test"

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Any:
        logging.getLogger("control_plane_broker.identity.test").warning("checking the proof")
        raise IdentityNotProven("no proof", reason="token-invalid")


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Every line logged meanwhile, as the process writes it (the one JSON format)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    before = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def parsed(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_every_line_of_a_request_carries_its_request_id_and_the_answer_echoes_it(
    json_lines: io.StringIO,
) -> None:
    touched: list[str] = []
    cache = Cache(touched)
    cache.synced = True
    app = AccessLog(
        create_app(
            issuer=issuer_with(cache, touched, verifier=Chatty()),
            reporter=reporter_with(cache, touched),
            metrics=Metrics(),
            health=Health(ready=lambda: (True, []), live=lambda: True),
            jitter_max=0,
            access_log=False,
        )
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        given = await client.post(
            "/v1/runtimes/rt-1/token", headers={"Authorization": "x", "X-Request-ID": "req-42.a:b"}
        )
        made = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "x"})
    assert given.headers["X-Request-ID"] == "req-42.a:b"
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-ID"])
    lines = parsed(json_lines)
    by_id = {
        rid: [line["msg"] for line in lines if line.get("request_id") == rid]
        for rid in (given.headers["X-Request-ID"], made.headers["X-Request-ID"])
    }
    assert all(msgs == ["checking the proof", "request"] for msgs in by_id.values()), by_id
    access = [line for line in lines if line["msg"] == "request"]
    assert [line["problem"] for line in access] == ["identity-not-proven"] * 2
    assert [line["status"] for line in access] == [401, 401]


@pytest.mark.parametrize(
    "offered",
    [
        "x" * 129,
        "has space",
        "new\nline",
        "\x1b[31mred",
        '"quoted"',
        "-leading-dash",
        "semi;colon",
        "",
        "ünïcode",
    ],
)
def test_a_hostile_request_id_is_replaced_by_a_fresh_one(offered: str) -> None:
    made = request_id_from(offered)
    assert made != offered
    assert re.fullmatch(r"[0-9a-f]{32}", made)


@pytest.mark.parametrize(
    "offered", ["a", "x" * 128, "4bf92f3577b34da6a3ce929d0e0e4736", "a-b_c.d:e"]
)
def test_a_plausible_request_id_is_kept(offered: str) -> None:
    assert request_id_from(offered) == offered


@pytest.mark.parametrize(
    ("path", "status", "level"),
    [
        ("/healthz", 200, logging.DEBUG),
        ("/readyz", 200, logging.DEBUG),
        ("/metrics", 200, logging.DEBUG),
        ("/readyz", 503, logging.INFO),  # not ready is news
        ("/v1/runtimes/rt-1/token", 201, logging.INFO),
        ("/v1/runtimes/rt-1/token", 503, logging.INFO),
    ],
)
def test_probes_are_logged_at_debug_while_they_succeed(path: str, status: int, level: int) -> None:
    assert access_level(path, status) == level


async def test_probes_log_at_debug_and_answers_at_the_door_name_their_problem(
    world: World, json_lines: io.StringIO
) -> None:
    world.cache.synced = True
    await world.client.get("/healthz")
    await world.client.get("/metrics")
    await world.client.post("/v1/runtimes/a/b/token")
    access = [line for line in parsed(json_lines) if line["msg"] == "request"]
    assert [(line["path"], line["level"]) for line in access] == [
        ("/healthz", "debug"),
        ("/metrics", "debug"),
        ("/v1/runtimes/a/b/token", "info"),
    ]
    assert access[-1]["problem"] == "not-found"


class Unreachable:
    """A verifier whose runtime API server cannot be reached (as the TokenReview adapter says)."""

    mode = "test"

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Any:
        request = httpx.Request("POST", "https://10.1.2.3:6443/apis/authentication.k8s.io/v1/x")
        try:
            try:
                raise httpx.ConnectError("[Errno 113] No route to host", request=request)
            except httpx.ConnectError as exc:
                raise KubeUnavailable(f"POST /apis/...: {describe_transport_error(exc)}") from exc
        except KubeUnavailable as exc:
            raise ControlPlaneUnavailable("runtime API server unreachable", retry_after=5) from exc


async def test_an_answer_caused_by_an_upstream_failure_logs_server_and_cause(
    json_lines: io.StringIO,
) -> None:
    touched: list[str] = []
    cache = Cache(touched)
    cache.synced = True
    app = create_app(
        issuer=issuer_with(cache, touched, verifier=Unreachable()),
        reporter=reporter_with(cache, touched),
        metrics=Metrics(),
        health=Health(ready=lambda: (True, []), live=lambda: True),
        jitter_max=0,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://broker.test"
    ) as client:
        r = await client.post("/v1/runtimes/rt-1/token", headers={"Authorization": "x"})
    assert (r.status_code, kind(r)) == (503, "control-plane-unavailable")
    assert "10.1.2.3" not in r.text  # the caller learns nothing about the servers behind
    lines = parsed(json_lines)
    [warning] = [line for line in lines if line["msg"] == "upstream request failed"]
    assert warning["cause"] == (
        "POST /apis/...: ConnectError (https://10.1.2.3:6443): [Errno 113] No route to host"
    )
    assert warning["problem"] == "control-plane-unavailable"
    assert warning["request_id"] == r.headers["X-Request-ID"]
