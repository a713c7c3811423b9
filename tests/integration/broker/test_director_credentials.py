"""The broker's own Director credentials refused (issue 35), against the Compass simulator's
real OAuth token endpoint: while it refuses them every token request is 503
`compass-unavailable` with Retry-After (never 502), one ERROR line says so, the metrics and
/readyz (still 200) name it; a credentials file fixed the way the kubelet updates a mounted
Secret (a new directory, the `..data` link swapped) brings tokens back, without a restart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import (
    CLIENT_ID,
    CLIENT_SECRET,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
WRONG_SECRET = "rotated-away-secret-4f1c9e"
REFUSED = "Director's OAuth token endpoint refuses the broker's credentials"


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


class MountedSecret:
    """A Secret volume as the kubelet keeps it: `..<timestamp>/` holds the files, `..data`
    links to it, the key links through `..data`; an update swaps `..data` with one rename."""

    def __init__(self, root: Path, key: str = "credentials.yaml") -> None:
        self.root, self.key, self.generation = root, key, 0
        root.mkdir(parents=True)

    @property
    def path(self) -> Path:
        return self.root / self.key

    def write(self, text: str) -> None:
        self.generation += 1
        fresh = self.root / f"..2026_01_01_00_00_{self.generation:02d}.1"
        fresh.mkdir()
        (fresh / self.key).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(fresh.name)
        tmp.rename(data)
        if not self.path.is_symlink():
            self.path.symlink_to(Path("..data") / self.key)
        if old is not None:
            (self.root / old / self.key).unlink()
            (self.root / old).rmdir()


def credentials(secret: str, token_url: str) -> str:
    return (
        f"data:\n  client_id: {CLIENT_ID}\n  client_secret: {secret}\n"
        f"  tokens_endpoint: {token_url}\n"
    )


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


def sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


def test_refused_credentials_are_compass_unavailable_until_the_secret_is_fixed_without_restart(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any, tmp_path: Path
) -> None:
    mounted = MountedSecret(tmp_path / "director-credentials")
    mounted.write(credentials(WRONG_SECRET, sim.token_url))
    broker = brokers(
        BROKER_DIRECTOR_CREDENTIALS_FILE=str(mounted.path),
        BROKER_BREAKER_FAILURE_THRESHOLD="3",
        BROKER_BREAKER_OPEN_SECONDS="1",
    )
    assert broker.proc is not None
    pid = broker.proc.pid

    for _ in range(8):
        r = broker.request_token(rt_a.runtime_id, rt_a.token())
        assert (r.status_code, problem_type(r)) == (503, "compass-unavailable"), r.text
        assert int(r.headers["Retry-After"]) >= 1
    assert not list(sim.runtimes(rt_a.tenant))  # nothing registered while refused

    scrape = broker.metrics()
    assert sample(scrape, "broker_director_credentials_ok") == 0
    assert sample(scrape, "broker_director_credentials_refused_total") >= 1
    ready = httpx.get(f"{broker.url}/readyz", timeout=5)
    assert ready.status_code == 200  # reported, not failed: see api.app.Health
    [degraded] = ready.json()["degraded"]
    assert sim.token_url in degraded
    assert "HTTP 401 invalid_client" in degraded

    logs = broker.logs()
    errors = [e for e in logs if e.get("msg", "").startswith(REFUSED)]
    assert len(errors) == 1, errors
    assert errors[0]["level"] == "error"
    assert errors[0]["endpoint"] == sim.token_url
    assert errors[0]["status"] == 401
    assert errors[0]["oauth_error"] == "invalid_client"
    # What each refused request logged names the token endpoint's answer.
    causes = [e for e in logs if e.get("msg") == "upstream request failed"]
    assert causes
    assert all("HTTP 401 invalid_client" in e["cause"] for e in causes)

    # The operator fixes the Secret; the kubelet swaps it in. Same process throughout.
    mounted.write(credentials(CLIENT_SECRET, sim.token_url))
    r = wait_for(
        lambda: (
            (resp := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 201
            and resp
        ),
        timeout=20,
        interval=0.5,
        what="a token after the credentials file was fixed",
    )
    assert r.json()["compassRuntimeID"] == next(iter(sim.runtimes(rt_a.tenant))).id
    assert broker.running()
    assert broker.proc.pid == pid

    scrape = broker.metrics()
    assert sample(scrape, "broker_director_credentials_ok") == 1
    ready = httpx.get(f"{broker.url}/readyz", timeout=5)
    assert (ready.status_code, ready.json()["degraded"]) == (200, [])
    logs = broker.logs()
    assert [e["level"] for e in logs if e.get("msg", "").startswith(REFUSED)] == ["error"]
    recovered = [
        e
        for e in logs
        if e.get("msg") == "Director's OAuth token endpoint accepts the broker's credentials again"
    ]
    assert len(recovered) == 1
    assert recovered[0]["level"] == "warning"
    reread = [
        e
        for e in logs
        if e.get("msg") == "Director credentials file read again: new credentials in force"
    ]
    assert reread
    assert reread[0]["changed"] == ["secret"]
    # No line ever held either secret.
    assert not any(WRONG_SECRET in line or CLIENT_SECRET in line for line in broker.lines)
    # The one registration: nothing was registered while refused, nothing twice after.
    assert len(list(sim.runtimes(rt_a.tenant))) == 1
