"""The broker client's outcome mapping and its retry loop, on httpx's MockTransport."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from agent.broker_client import BrokerClient
from agent.credentials import IdentityError, ServiceAccountIdentity
from agent.outcomes import Accepted, Issued, Outcome, Refused, Temporary
from agent.retry_policy import Jitter, RetryPolicy

NOW = datetime(2025, 1, 1, 12, tzinfo=UTC)
TOKEN_BODY = {
    "token": "ott-secret-value",
    "connectorURL": "https://connector.example/graphql",
    "compassRuntimeID": "c-1",
    "tenant": "ga-1",
    "expiresAt": "2025-01-01T13:00:00Z",
}


class StaticIdentity:
    def __init__(self, value: str | None = "Bearer sa-token") -> None:
        self.value = value

    async def authorization(self) -> str | None:
        return self.value


def problem(status: int, kind: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(
        status,
        headers={"Content-Type": "application/problem+json", **(headers or {})},
        content=json.dumps({"type": kind, "title": kind, "detail": "why"}).encode(),
    )


def make_client(
    handler: httpx.MockTransport, sleeps: list[float], identity: object = None
) -> BrokerClient:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return BrokerClient(
        base_url="https://broker.test/",
        identity=identity or StaticIdentity(),  # type: ignore[arg-type]
        policy=RetryPolicy(base=1.0, factor=2.0, cap=8.0, jitter=Jitter.NONE),
        timeout=5.0,
        transport=handler,
        clock=lambda: NOW,
        sleep=sleep,
    )


async def test_issued_carries_all_fields_and_hides_the_token() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json=TOKEN_BODY)

    client = make_client(httpx.MockTransport(handle), [])
    outcome = await client.request_once("Rt/1")
    await client.aclose()
    assert isinstance(outcome, Issued)
    assert outcome.token == "ott-secret-value"
    assert outcome.connector_url == TOKEN_BODY["connectorURL"]
    assert outcome.compass_runtime_id == "c-1"
    assert outcome.tenant == "ga-1"
    assert outcome.expires_at == datetime(2025, 1, 1, 13, tzinfo=UTC)
    assert outcome.issued_at == NOW
    assert "ott-secret-value" not in repr(outcome)
    assert seen[0].method == "POST"
    assert seen[0].url.raw_path == b"/v1/runtimes/Rt%2F1/token"
    assert seen[0].headers["Authorization"] == "Bearer sa-token"


@pytest.mark.parametrize("status", [401, 403, 404, 409, 400])
async def test_permanent_statuses_are_refusals(status: int) -> None:
    client = make_client(httpx.MockTransport(lambda r: problem(status, f"urn:x:{status}")), [])
    outcome = await client.request_once("rt")
    await client.aclose()
    assert outcome == Refused(status=status, reason=f"urn:x:{status}", detail="why")


BROKER_PROBLEM = "urn:kyma-compass-pull:broker:problem:"


async def test_a_502_the_broker_calls_permanent_is_a_refusal_not_a_retry_loop() -> None:
    """Each retry of a `compass-rejected` was one more Director call, for ever: the agent now
    takes it as a refusal (asked again at the refusal cadence or when the Kyma changes)."""
    sleeps: list[float] = []
    asked: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(1)
        if len(asked) > 3:  # an agent that retried would get a token here
            return httpx.Response(201, json=TOKEN_BODY)
        return problem(502, BROKER_PROBLEM + "compass-rejected")

    client = make_client(httpx.MockTransport(handle), sleeps)
    outcome = await client.pull("rt")
    await client.aclose()
    assert outcome == Refused(status=502, reason=BROKER_PROBLEM + "compass-rejected", detail="why")
    assert (len(asked), sleeps) == (1, [])


@pytest.mark.parametrize(
    "response",
    [
        problem(502, BROKER_PROBLEM + "compass-failed"),  # Director's internal error: unknown
        httpx.Response(502),  # a gateway in front of the broker
        problem(502, "urn:other:compass-rejected-ish"),
    ],
)
async def test_other_502s_back_off_to_the_cap(response: httpx.Response) -> None:
    sleeps: list[float] = []
    answers = iter([response] * 6 + [httpx.Response(201, json=TOKEN_BODY)])
    client = make_client(httpx.MockTransport(lambda r: next(answers)), sleeps)
    outcome = await client.pull("rt")
    await client.aclose()
    assert isinstance(outcome, Issued)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # capped at the policy's 8 s


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            problem(503, "urn:unavailable", {"Retry-After": "17"}),
            Temporary("urn:unavailable", 503, 17.0),
        ),
        (problem(429, "urn:slow-down", {"Retry-After": "3"}), Temporary("urn:slow-down", 429, 3.0)),
        (problem(500, "urn:oops"), Temporary("urn:oops", 500, None)),
        (httpx.Response(408), Temporary("Request Timeout", 408, None)),  # from a gateway
        (httpx.Response(425), Temporary("Too Early", 425, None)),
        (httpx.Response(201, content=b"not json"), Temporary("malformed token response", 201)),
        (httpx.Response(302), Temporary("unexpected status 302", 302)),
    ],
)
async def test_temporary_statuses(response: httpx.Response, expected: Temporary) -> None:
    client = make_client(httpx.MockTransport(lambda r: response), [])
    outcome = await client.request_once("rt")
    await client.aclose()
    assert outcome == expected


async def test_transport_error_is_temporary_naming_server_and_cause_not_the_path() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    client = make_client(httpx.MockTransport(handle), [])
    outcome = await client.request_once("rt")
    await client.aclose()
    assert isinstance(outcome, Temporary)
    assert outcome.reason == "transport: ConnectError"  # a stable label
    assert outcome.detail == "ConnectError (https://broker.test): [Errno 111] Connection refused"


async def test_pull_retries_temporary_with_growing_backoff_and_retry_after() -> None:
    answers = iter(
        [
            problem(500, "a"),
            problem(500, "b"),
            problem(503, "c", {"Retry-After": "30"}),
            problem(500, "d"),
            problem(500, "e"),
            problem(500, "f"),
            httpx.Response(201, json=TOKEN_BODY),
        ]
    )
    sleeps: list[float] = []
    outcomes: list[Outcome] = []
    client = make_client(httpx.MockTransport(lambda r: next(answers)), sleeps)
    result = await client.pull("rt", on_attempt=outcomes.append)
    await client.aclose()
    assert isinstance(result, Issued)
    # base 1, factor 2, cap 8; Retry-After 30 beats the 4 s step; the failures after it
    # start again at the base (the server's answer was not one of them), then grow.
    assert sleeps == [1.0, 2.0, 30.0, 1.0, 2.0, 4.0]
    assert [type(o).__name__ for o in outcomes] == ["Temporary"] * 6 + ["Issued"]


async def test_a_timeout_after_a_long_run_of_503s_backs_off_from_the_base() -> None:
    # After an outage an agent has obeyed many Retry-After answers; its first timeout must not
    # send it to the cap (8 s here, 300 s by default) while the broker has room again.
    answers = iter(
        [problem(503, "busy", {"Retry-After": "5"}) for _ in range(10)]
        + [
            httpx.ReadTimeout("slow"),
            httpx.ReadTimeout("slow"),
            httpx.Response(201, json=TOKEN_BODY),
        ]
    )

    def handle(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sleeps: list[float] = []
    client = make_client(httpx.MockTransport(handle), sleeps)
    result = await client.pull("rt")
    await client.aclose()
    assert isinstance(result, Issued)
    assert sleeps == [5.0] * 10 + [1.0, 2.0]


async def test_pull_stops_at_a_refusal() -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return problem(500, "x") if calls == 1 else problem(403, "urn:forbidden")

    sleeps: list[float] = []
    client = make_client(httpx.MockTransport(handle), sleeps)
    result = await client.pull("rt")
    await client.aclose()
    assert result == Refused(403, "urn:forbidden", "why")
    assert calls == 2
    assert sleeps == [1.0]


async def test_identity_failure_is_temporary_and_sends_nothing(tmp_path: Path) -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(201, json=TOKEN_BODY)

    identity = ServiceAccountIdentity(
        token_file=tmp_path / "absent", requester=None, clock=lambda: NOW
    )
    client = make_client(httpx.MockTransport(handle), [], identity)
    outcome = await client.request_once("rt")
    await client.aclose()
    assert isinstance(outcome, Temporary)
    assert outcome.reason.startswith("identity:")
    assert calls == 0


async def test_token_file_is_reread_for_every_request(tmp_path: Path) -> None:
    path = tmp_path / "token"
    identity = ServiceAccountIdentity(token_file=path, requester=None, clock=lambda: NOW)
    path.write_text("first\n")
    assert await identity.authorization() == "Bearer first"
    path.write_text("rotated")
    assert await identity.authorization() == "Bearer rotated"
    path.unlink()
    with pytest.raises(IdentityError):
        await identity.authorization()


@pytest.mark.parametrize(
    ("expires", "expected"),
    [
        ("2025-01-01T13:00:00Z", datetime(2025, 1, 1, 13, tzinfo=UTC)),
        ("2025-01-01T13:00:00", datetime(2025, 1, 1, 13, tzinfo=UTC)),
        (1735736400, datetime(2025, 1, 1, 13, tzinfo=UTC)),
        (1735736400000, datetime(2025, 1, 1, 13, tzinfo=UTC)),
        (None, datetime(2025, 1, 1, 13, tzinfo=UTC)),  # Compass default: 60 minutes
    ],
)
async def test_expiry_formats(expires: object, expected: datetime) -> None:
    body = {**TOKEN_BODY, "expiresAt": expires}
    client = make_client(httpx.MockTransport(lambda r: httpx.Response(201, json=body)), [])
    outcome = await client.request_once("rt")
    await client.aclose()
    assert isinstance(outcome, Issued)
    assert outcome.expires_at == expected


# -- connection reports and revocation ------------------------------------------------------------

REVOKED_TYPE = "https://broker.test/problems/runtime-revoked"


def revoked_problem() -> httpx.Response:
    body = {
        "type": REVOKED_TYPE,
        "title": "The runtime is revoked in the control plane",
        "status": 403,
        "detail": "decommissioned by ops",
    }
    return httpx.Response(
        403, headers={"Content-Type": "application/problem+json"}, content=json.dumps(body).encode()
    )


async def test_a_report_goes_to_the_connection_endpoint_with_the_same_identity() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"nextReportAfterSeconds": 120})

    client = make_client(httpx.MockTransport(handle), [])
    body = b'{"connectionState":"Connected","observedAt":"2025-01-01T12:00:00.000Z"}'
    outcome = await client.report("Rt/1", body)
    await client.aclose()
    assert outcome == Accepted(next_report_after=120.0)
    assert seen[0].method == "POST"
    assert seen[0].url.raw_path == b"/v1/runtimes/Rt%2F1/connection"
    assert seen[0].headers["Authorization"] == "Bearer sa-token"
    assert seen[0].headers["Content-Type"] == "application/json"
    assert seen[0].content == body


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"not json",
        b"[]",
        b"{}",
        b'{"nextReportAfterSeconds": "60"}',
        b'{"nextReportAfterSeconds": true}',
        b'{"nextReportAfterSeconds": 0}',
        b'{"nextReportAfterSeconds": -5}',
        b'{"nextReportAfterSeconds": Infinity}',
        b'{"nextReportAfterSeconds": NaN}',
        b"[" * 100_000,
    ],
)
async def test_an_accepted_report_without_a_usable_wish_keeps_the_agents_heartbeat(
    answer: bytes,
) -> None:
    client = make_client(httpx.MockTransport(lambda r: httpx.Response(202, content=answer)), [])
    outcome = await client.report("rt", b"{}")
    await client.aclose()
    assert outcome == Accepted(next_report_after=None)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            problem(429, "urn:rate-limited", {"Retry-After": "10"}),
            Temporary("urn:rate-limited", 429, 10.0),
        ),
        (
            problem(503, "urn:control-plane-unavailable", {"Retry-After": "5"}),
            Temporary("urn:control-plane-unavailable", 503, 5.0),
        ),
        (problem(400, "urn:malformed-request"), Refused(400, "urn:malformed-request", "why")),
        (problem(409, "urn:module-not-enabled"), Refused(409, "urn:module-not-enabled", "why")),
    ],
)
async def test_report_failures_map_like_token_failures(
    response: httpx.Response, expected: object
) -> None:
    client = make_client(httpx.MockTransport(lambda r: response), [])
    outcome = await client.report("rt", b"{}")
    await client.aclose()
    assert outcome == expected


async def test_a_report_is_sent_once_never_retried_by_the_client() -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    sleeps: list[float] = []
    client = make_client(httpx.MockTransport(handle), sleeps)
    outcome = await client.report("rt", b"{}")
    await client.aclose()
    assert isinstance(outcome, Temporary)
    assert outcome.reason == "transport: ConnectError"
    assert calls == 1
    assert sleeps == []


@pytest.mark.parametrize("call", ["token", "report"])
async def test_runtime_revoked_is_a_revoked_refusal_with_the_operators_reason(call: str) -> None:
    client = make_client(httpx.MockTransport(lambda r: revoked_problem()), [])
    if call == "token":
        outcome: object = await client.pull("rt")
    else:
        outcome = await client.report("rt", b"{}")
    await client.aclose()
    assert outcome == Refused(403, REVOKED_TYPE, "decommissioned by ops")
    assert isinstance(outcome, Refused)
    assert outcome.revoked
