"""The broker's own Director credentials (issue 35): every answer of the OAuth token endpoint
that is not a token is Compass unavailable (503 `compass-unavailable`, counted by the breaker,
never a runtime's fault); a refusal logs one ERROR per episode and shows in the metrics and
/readyz; the credentials file is read again when Kubernetes swaps in a changed Secret."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from control_plane_broker.api.access import upstream_cause
from control_plane_broker.api.problems import problem_for
from control_plane_broker.director.answers import RuntimeRegisterInput
from control_plane_broker.director.classification import (
    DirectorCredentialsRefused,
    DirectorPermanent,
    DirectorRetryable,
)
from control_plane_broker.director.graphql_client import DirectorClient
from control_plane_broker.director.oauth import (
    CHECK_EVERY_SECONDS,
    FAILURE_MEMORY_SECONDS,
    CredentialsFile,
    OAuthTokenSource,
    endpoint_for_logs,
    oauth_error_code,
)
from control_plane_broker.errors import CompassUnavailable
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.director_limiter import DirectorLimiter
from control_plane_broker.settings import CredentialsInvalid, DirectorCredentials
from control_plane_broker.wiring import degraded

ENDPOINT = "https://oauth.test/oauth2/token"
OLD_SECRET = "old-secret-value-0123456789"
NEW_SECRET = "new-secret-value-9876543210"
CREDS = DirectorCredentials("broker-client", OLD_SECRET, ENDPOINT)
OAUTH_LOGGER = "control_plane_broker.director.oauth"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TokenEndpoint:
    """Issues tokens to `accepted` secrets, refuses others as `refusal`; or answers `answer`."""

    def __init__(self, accepted: set[str] | None = None) -> None:
        self.accepted = accepted if accepted is not None else {OLD_SECRET}
        self.refusal = httpx.Response(
            401,
            json={
                "error": "invalid_client",
                "error_description": f"client secret {OLD_SECRET} is not valid",
            },
        )
        self.answer: httpx.Response | Exception | None = None
        self.secrets_seen: list[str] = []
        self.issued = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.answer is not None:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer
        basic = request.headers["Authorization"].removeprefix("Basic ")
        secret = base64.b64decode(basic).decode().partition(":")[2]
        self.secrets_seen.append(secret)
        if secret not in self.accepted:
            return self.refusal
        self.issued += 1
        return httpx.Response(200, json={"access_token": f"at-{self.issued}", "expires_in": 300})


def source_for(
    endpoint: TokenEndpoint,
    credentials: DirectorCredentials | CredentialsFile = CREDS,
    *,
    clock: Clock | None = None,
    metrics: Metrics | None = None,
) -> tuple[OAuthTokenSource, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handler))
    source = OAuthTokenSource(
        http,
        credentials,
        scope="runtime:read runtime:write",
        clock=clock or Clock(),
        on_verdict=metrics.on_credentials_verdict if metrics is not None else None,
    )
    return source, http


# --- classification of the token endpoint's answers -------------------------------------------


def _json(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(body).encode())


@pytest.mark.parametrize(
    ("answer", "refused"),
    [
        (_json({"error": "invalid_client"}, 401), True),
        (httpx.Response(401), True),
        (_json({"error": "access_denied"}, 403), True),
        (_json({"error": "invalid_scope"}, 400), True),
        (_json({"error": "invalid_grant"}, 400), True),
        (httpx.Response(500), False),
        (httpx.Response(502, text="<html>bad gateway</html>"), False),
        (httpx.Response(429), False),
        (httpx.Response(404), False),  # a wrong endpoint in the file: not about a runtime
        (httpx.Response(302, headers={"Location": "https://login.test/"}), False),
        (httpx.Response(204), False),
        (httpx.Response(200, text="not json"), False),
        (_json({"token_type": "bearer"}), False),  # no access_token
        (_json({"access_token": ""}), False),
        (_json({"access_token": 12345}), False),
        (_json({"access_token": "a", "expires_in": "soon"}), False),
        (_json({"access_token": "a", "expires_in": -5}), False),
        (_json({"access_token": "a", "expires_in": True}), False),
        (httpx.Response(200, text='{"access_token": "a", "expires_in": NaN}'), False),
        (_json(["access_token"]), False),
        (_json("access_token"), False),
        (httpx.ConnectError("connection refused"), False),
        (httpx.ReadTimeout("timed out"), False),
    ],
)
async def test_every_answer_that_is_no_token_is_compass_unavailable(
    answer: httpx.Response | Exception, refused: bool
) -> None:
    endpoint = TokenEndpoint()
    endpoint.answer = answer
    source, http = source_for(endpoint)
    with pytest.raises(DirectorRetryable) as caught:
        await source.token()
    assert isinstance(caught.value, DirectorCredentialsRefused) is refused
    assert not isinstance(caught.value, DirectorPermanent)
    problem = problem_for(
        caught.value, instance="/v1/runtimes/r/token", jitter_max=0, rand=lambda: 0.5
    )
    assert (problem.status, problem.body["type"].rsplit(":", 1)[1]) == (503, "compass-unavailable")
    assert int(problem.headers["Retry-After"]) >= 1
    assert OLD_SECRET not in problem.body["detail"]
    await http.aclose()


async def test_a_usable_token_with_a_numeric_string_lifetime_is_taken() -> None:
    endpoint = TokenEndpoint()
    endpoint.answer = _json({"access_token": "tok", "expires_in": "300"})
    source, http = source_for(endpoint)
    assert await source.token() == "tok"
    await http.aclose()


async def test_the_answer_of_a_refused_request_names_the_endpoint_and_status() -> None:
    """What `upstream request failed` logs for the request whose fetch was refused: the server
    and the status with its OAuth error code, nothing of the path, the secret or the body."""
    endpoint = TokenEndpoint(accepted=set())
    source, http = source_for(endpoint)
    with pytest.raises(DirectorCredentialsRefused) as caught:
        await source.token()
    assert (
        upstream_cause(caught.value)
        == "HTTPStatusError (https://oauth.test): HTTP 401 invalid_client"
    )
    assert str(caught.value) == (
        "OAuth token endpoint refused the broker's credentials: HTTP 401 invalid_client"
    )
    await http.aclose()


def test_only_the_oauth_error_code_of_a_refusal_is_kept() -> None:
    assert oauth_error_code(b'{"error": "invalid_client", "error_description": "x"}') == (
        "invalid_client"
    )
    assert oauth_error_code(b'{"error": "line\\nbreak"}') is None
    assert oauth_error_code(b'{"error": "' + b"a" * 65 + b'"}') is None
    assert oauth_error_code(b"<html>") is None
    assert oauth_error_code(b'{"error": {"nested": 1}}') is None
    assert endpoint_for_logs("https://user:pw@oauth.test:8443/oauth2/token?x=1") == (
        "https://oauth.test:8443/oauth2/token"
    )


async def test_a_refusal_reaches_no_graphql_call_and_the_breaker_counts_it() -> None:
    endpoint = TokenEndpoint(accepted=set())
    graphql_calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "oauth.test":
            return endpoint.handler(request)
        graphql_calls.append(request)
        return httpx.Response(200, json={"data": {}})

    clock = Clock()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=2, open_seconds=10),
        max_concurrency=2,
        queue_timeout=1,
        clock=clock,
    )
    oauth = OAuthTokenSource(http, CREDS, scope="s", clock=clock)
    client = DirectorClient(
        http=http, url="https://director.test/graphql", oauth=oauth, limiter=limiter
    )
    for _ in range(2):
        with pytest.raises(CompassUnavailable) as caught:
            await client.register_runtime(tenant="t", spec=RuntimeRegisterInput(name="n"))
        assert not isinstance(caught.value, DirectorPermanent)
        clock.now += FAILURE_MEMORY_SECONDS
    assert limiter.refusing()  # two refusals in a row opened the breaker
    assert graphql_calls == []
    await http.aclose()


# --- one ERROR per refusal episode, the metrics, /readyz --------------------------------------


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == OAUTH_LOGGER and r.levelno == level]


def _all_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)


def _metric(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


async def test_one_error_per_refusal_episode_and_one_line_when_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint, clock, metrics = TokenEndpoint(accepted=set()), Clock(), Metrics()
    source, http = source_for(endpoint, clock=clock, metrics=metrics)
    assert _metric(metrics, "broker_director_credentials_ok") == 1  # nothing known yet
    assert source.refusal() is None
    for _ in range(20):  # twenty requests of the fleet, each after the failure memory
        with pytest.raises(DirectorCredentialsRefused):
            await source.token()
        clock.now += FAILURE_MEMORY_SECONDS
    errors = _records(caplog, logging.ERROR)
    assert len(errors) == 1
    error = errors[0]
    assert error.__dict__["endpoint"] == ENDPOINT
    assert error.__dict__["status"] == 401
    assert error.__dict__["oauth_error"] == "invalid_client"
    assert error.__dict__["client_id"] == "broker-client"
    assert _metric(metrics, "broker_director_credentials_refused_total") == 20
    assert _metric(metrics, "broker_director_credentials_ok") == 0
    refusal = source.refusal()
    assert refusal is not None
    assert ENDPOINT in refusal
    assert "HTTP 401 invalid_client" in refusal
    assert degraded(source)() == [refusal]

    endpoint.accepted = {OLD_SECRET}  # the identity provider takes the secret again
    assert await source.token() == "at-1"
    recovered = _records(caplog, logging.WARNING)
    assert [r.getMessage() for r in recovered] == [
        "Director's OAuth token endpoint accepts the broker's credentials again"
    ]
    assert recovered[0].__dict__["refusals"] == 20
    assert _metric(metrics, "broker_director_credentials_ok") == 1
    assert source.refusal() is None
    assert degraded(source)() == []

    # A later refusal is a new episode: one more ERROR.
    endpoint.accepted = set()
    source.invalidate()
    for _ in range(3):
        with pytest.raises(DirectorCredentialsRefused):
            await source.token()
        clock.now += FAILURE_MEMORY_SECONDS
    assert len(_records(caplog, logging.ERROR)) == 2
    # Never the secret, never the answer's free text.
    text = _all_text(caplog)
    assert OLD_SECRET not in text
    assert "is not valid" not in text
    assert (
        "broker_director_credentials_refused_total 23.0"
        in generate_latest(metrics.registry).decode()
    )
    await http.aclose()


async def test_callers_that_share_a_refused_fetch_cost_one_call_and_log_nothing_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint, clock, metrics = TokenEndpoint(accepted=set()), Clock(), Metrics()
    source, http = source_for(endpoint, clock=clock, metrics=metrics)
    results = await asyncio.gather(*(source.token() for _ in range(10)), return_exceptions=True)
    assert all(isinstance(r, DirectorCredentialsRefused) for r in results)
    assert len(endpoint.secrets_seen) == 1
    assert len(_records(caplog, logging.ERROR)) == 1
    assert _metric(metrics, "broker_director_credentials_refused_total") == 1
    await http.aclose()


# --- the credentials file, as Kubernetes mounts a Secret -------------------------------------


class MountedSecret:
    """A Secret volume as the kubelet writes it: `<dir>/..<timestamp>/` holds the files,
    `..data` links to it, and each key is a link `<key> -> ..data/<key>`. An update writes a new
    timestamped directory, swaps `..data` with one rename, and removes the old directory."""

    def __init__(self, root: Path, key: str = "credentials.yaml") -> None:
        self.root, self.key, self.generation = root, key, 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        return self.root / self.key

    def write(self, text: str | None) -> None:
        """`text` None: the new generation lacks the key (the file is gone behind its link)."""
        self.generation += 1
        fresh = self.root / f"..2026_01_01_00_00_{self.generation:02d}.{os.getpid()}"
        fresh.mkdir()
        if text is not None:
            (fresh / self.key).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(fresh.name)
        tmp.rename(data)  # atomic: readers see the old or the new generation, never neither
        if not self.path.is_symlink():
            self.path.symlink_to(Path("..data") / self.key)
        if old is not None:
            for child in (self.root / old).iterdir():
                child.unlink()
            (self.root / old).rmdir()


def credentials_yaml(secret: str, *, client_id: str = "broker-client") -> str:
    return (
        f"data:\n  client_id: {client_id}\n  client_secret: {secret}\n"
        f"  tokens_endpoint: {ENDPOINT}\n"
    )


@pytest.fixture
def secret(tmp_path: Path) -> MountedSecret:
    mounted = MountedSecret(tmp_path / "director")
    mounted.write(credentials_yaml(OLD_SECRET))
    return mounted


def test_the_file_is_read_again_after_a_symlink_swap_at_most_every_few_seconds(
    secret: MountedSecret,
) -> None:
    clock = Clock()
    file = CredentialsFile(secret.path, clock=clock)
    assert file.current().client_secret == OLD_SECRET
    secret.write(credentials_yaml(NEW_SECRET))
    clock.now += CHECK_EVERY_SECONDS / 2
    assert file.current().client_secret == OLD_SECRET  # not looked at yet
    clock.now += CHECK_EVERY_SECONDS / 2
    assert file.current().client_secret == NEW_SECRET
    secret.write(credentials_yaml(OLD_SECRET, client_id="other-client"))
    assert file.check() == DirectorCredentials("other-client", OLD_SECRET, ENDPOINT)


def test_a_broken_file_keeps_the_last_good_credentials_and_logs_one_error_each(
    secret: MountedSecret, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    file = CredentialsFile(secret.path, clock=clock)
    secret.write(f"data: [{NEW_SECRET}\n")  # not YAML
    for _ in range(5):
        clock.now += CHECK_EVERY_SECONDS
        assert file.current() == CREDS
    secret.write("data:\n  client_id: x\n")  # no secret, no endpoint
    for _ in range(5):
        clock.now += CHECK_EVERY_SECONDS
        assert file.current() == CREDS
    secret.write(None)  # the key gone from the Secret: the link dangles
    for _ in range(5):
        clock.now += CHECK_EVERY_SECONDS
        assert file.current() == CREDS
    errors = _records(caplog, logging.ERROR)
    problems = [r.__dict__["problem"] for r in errors]
    assert len(problems) == 3, problems
    assert "neither YAML nor JSON" in problems[0]
    assert "missing client_secret, tokens_endpoint" in problems[1]
    assert "cannot be read" in problems[2]
    secret.write(credentials_yaml(NEW_SECRET))
    clock.now += CHECK_EVERY_SECONDS
    assert file.current().client_secret == NEW_SECRET
    infos = [r for r in caplog.records if r.name == OAUTH_LOGGER and r.levelno == logging.INFO]
    assert infos[-1].__dict__["changed"] == ["secret"]
    text = _all_text(caplog)
    assert OLD_SECRET not in text
    assert NEW_SECRET not in text


async def test_a_new_secret_drops_the_cached_access_token(secret: MountedSecret) -> None:
    endpoint, clock = TokenEndpoint(accepted={OLD_SECRET, NEW_SECRET}), Clock()
    source, http = source_for(endpoint, CredentialsFile(secret.path, clock=clock), clock=clock)
    assert await source.token() == "at-1"
    clock.now += CHECK_EVERY_SECONDS
    assert await source.token() == "at-1"  # unchanged file: the token is kept
    secret.write(credentials_yaml(OLD_SECRET))  # re-projected, same content
    clock.now += CHECK_EVERY_SECONDS
    assert await source.token() == "at-1"
    secret.write(credentials_yaml(NEW_SECRET))
    clock.now += CHECK_EVERY_SECONDS
    assert await source.token() == "at-2"
    assert endpoint.secrets_seen == [OLD_SECRET, NEW_SECRET]
    await http.aclose()


async def test_after_a_refusal_the_file_is_looked_at_at_once_and_the_new_secret_tried(
    secret: MountedSecret, caplog: pytest.LogCaptureFixture
) -> None:
    """The old secret was revoked before the kubelet swapped in the new one: the first
    request after the swap gets its token, without waiting for the next periodic look."""
    caplog.set_level(logging.DEBUG)
    endpoint, clock, metrics = TokenEndpoint(accepted={NEW_SECRET}), Clock(), Metrics()
    source, http = source_for(
        endpoint, CredentialsFile(secret.path, clock=clock), clock=clock, metrics=metrics
    )
    with pytest.raises(DirectorCredentialsRefused):
        await source.token()
    secret.write(credentials_yaml(NEW_SECRET))
    clock.now += FAILURE_MEMORY_SECONDS  # well within CHECK_EVERY_SECONDS
    assert await source.token() == "at-1"
    assert endpoint.secrets_seen == [OLD_SECRET, OLD_SECRET, NEW_SECRET]
    assert len(_records(caplog, logging.ERROR)) == 1
    assert len(_records(caplog, logging.WARNING)) == 1
    assert _metric(metrics, "broker_director_credentials_ok") == 1
    assert source.refusal() is None
    await http.aclose()


async def test_fixed_credentials_are_tried_at_once_not_after_the_failure_memory(
    secret: MountedSecret,
) -> None:
    endpoint, clock = TokenEndpoint(accepted={NEW_SECRET}), Clock()
    file = CredentialsFile(secret.path, clock=clock)
    source, http = source_for(endpoint, file, clock=clock)
    with pytest.raises(DirectorCredentialsRefused):
        await source.token()
    secret.write(credentials_yaml(NEW_SECRET))
    clock.now += CHECK_EVERY_SECONDS  # the periodic look finds it: no refusal remembered
    assert await source.token() == "at-1"
    assert endpoint.secrets_seen == [OLD_SECRET, NEW_SECRET]
    await http.aclose()


def test_a_file_missing_at_start_stops_the_broker(tmp_path: Path) -> None:
    with pytest.raises((OSError, CredentialsInvalid)):
        CredentialsFile(tmp_path / "none.yaml")
