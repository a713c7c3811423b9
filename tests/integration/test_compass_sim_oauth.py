"""Compass simulator, OAuth: client credentials, token lifetime, bearer checks and
scope enforcement by Director, all through HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.testing import (
    LIST_RUNTIMES,
    REGISTER_RUNTIME,
    DirectorClient,
    ManualClock,
    fetch_token,
)

pytestmark = pytest.mark.timeout(60)

CLIENT_ID = "broker-client"
CLIENT_SECRET = "broker-secret"
TTL = 600


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(
        client_id=CLIENT_ID, client_secret=CLIENT_SECRET, access_token_ttl_seconds=TTL
    )
    with CompassSimulator(config, clock=clock).running() as simulator:
        yield simulator


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


def _grant(scope: str) -> dict[str, str]:
    return {"grant_type": "client_credentials", "scope": scope}


def test_client_credentials_grant_returns_a_bearer_token(
    sim: CompassSimulator, http: httpx.Client
) -> None:
    response = http.post(
        sim.token_url, auth=(CLIENT_ID, CLIENT_SECRET), data=_grant("runtime:read runtime:write")
    )
    assert response.status_code == 200
    body = response.json()
    assert body["token_type"] == "bearer"
    assert body["expires_in"] == TTL
    assert set(body["scope"].split()) == {"runtime:read", "runtime:write"}
    assert len(body["access_token"]) >= 32
    assert response.headers["cache-control"] == "no-store"
    assert sim.counter("oauthToken").successes == 1


@pytest.mark.parametrize(
    "auth", [(CLIENT_ID, "wrong-secret"), ("someone-else", CLIENT_SECRET), None]
)
def test_unknown_client_or_wrong_secret_gets_401(
    sim: CompassSimulator, http: httpx.Client, auth: tuple[str, str] | None
) -> None:
    if auth is None:
        response = http.post(sim.token_url, data=_grant("runtime:read"))
    else:
        response = http.post(sim.token_url, auth=auth, data=_grant("runtime:read"))
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"
    assert response.headers["www-authenticate"].startswith("Basic")
    assert "access_token" not in response.json()


def test_credentials_are_accepted_only_through_basic_auth(
    sim: CompassSimulator, http: httpx.Client
) -> None:
    data = {**_grant("runtime:read"), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}
    assert http.post(sim.token_url, data=data).status_code == 401


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"scope": "runtime:read"}, "invalid_request"),
        ({"grant_type": "password", "scope": "runtime:read"}, "unsupported_grant_type"),
        (_grant("runtime:read application:write"), "invalid_scope"),
    ],
)
def test_bad_grant_requests_get_rfc6749_errors(
    sim: CompassSimulator, http: httpx.Client, data: dict[str, str], error: str
) -> None:
    response = http.post(sim.token_url, auth=(CLIENT_ID, CLIENT_SECRET), data=data)
    assert response.status_code == 400
    assert response.json()["error"] == error


def _error_codes(response: httpx.Response) -> list[int]:
    return [e["extensions"]["error_code"] for e in response.json()["errors"]]


def test_director_enforces_the_scopes_of_the_token(
    sim: CompassSimulator, http: httpx.Client
) -> None:
    def token(*scopes: str) -> str:
        return fetch_token(
            http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET, scopes=scopes
        )

    register = {"in": {"name": "scoped"}}
    reader = DirectorClient(http, sim.director_url, token=token("runtime:read"), tenant="t")
    assert reader.post(LIST_RUNTIMES).json()["data"]["result"]["totalCount"] == 0
    denied = reader.post(REGISTER_RUNTIME, register)
    assert _error_codes(denied) == [23]
    assert denied.json()["errors"][0]["extensions"]["error"] == "InsufficientScopes"
    assert sim.runtimes() == []

    writer = DirectorClient(http, sim.director_url, token=token("runtime:write"), tenant="t")
    assert writer.post(REGISTER_RUNTIME, register).json()["data"]["result"]["name"] == "scoped"
    assert _error_codes(writer.post(LIST_RUNTIMES)) == [23]

    nothing = DirectorClient(http, sim.director_url, token=token(), tenant="t")
    assert _error_codes(nothing.post(LIST_RUNTIMES)) == [23]


def test_director_rejects_missing_unknown_and_expired_bearer_tokens(
    sim: CompassSimulator, http: httpx.Client, clock: ManualClock
) -> None:
    def check_unauthorized(response: httpx.Response) -> None:
        assert response.status_code == 401
        assert _error_codes(response) == [26]
        assert response.json()["errors"][0]["extensions"]["error"] == "Unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")

    director = DirectorClient(http, sim.director_url, token=None, tenant="t")
    check_unauthorized(director.post(LIST_RUNTIMES))
    check_unauthorized(director.post(LIST_RUNTIMES, token="not-a-token"))

    token = fetch_token(http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    clock.advance(TTL - 1)
    assert director.post(LIST_RUNTIMES, token=token).status_code == 200
    clock.advance(2)
    check_unauthorized(director.post(LIST_RUNTIMES, token=token))
    assert sim.counter("runtimes").errors == 3
