"""Compass simulator: admin API, state file across restarts, and the command line."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devenv.compass_sim import CompassSimulator, Faults, SimConfig
from devenv.compass_sim.testing import (
    CONNECTOR_CONFIGURATION,
    LIST_RUNTIMES,
    REGISTER_RUNTIME,
    REQUEST_ONE_TIME_TOKEN,
    DirectorClient,
    fetch_token,
)

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parents[2]
TENANT = "ga-admin"


@pytest.fixture(scope="module")
def sim() -> Iterator[CompassSimulator]:
    with CompassSimulator(SimConfig(client_id="id", client_secret="secret")).running() as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


@pytest.fixture
def director(sim: CompassSimulator, http: httpx.Client) -> DirectorClient:
    return DirectorClient(http, sim.director_url, token=sim.issue_access_token(), tenant=TENANT)


def test_seeded_runtimes_are_served_like_registered_ones(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    seeded = http.post(
        f"{sim.admin_url}/_sim/runtimes",
        json={
            "tenant": TENANT,
            "name": "from-compass-manager",
            "labels": {"director_connection_managed_by": "compass-manager"},
            "id": "0b7bfc5e-9b8e-4c39-a1f5-8d7e4fcf3f0f",
        },
    )
    assert seeded.status_code == 201
    assert seeded.json()["id"] == "0b7bfc5e-9b8e-4c39-a1f5-8d7e4fcf3f0f"
    page = director.result(
        LIST_RUNTIMES,
        {"filter": [{"key": "director_connection_managed_by", "query": '"compass-manager"'}]},
    )
    assert [r["id"] for r in page["data"]] == ["0b7bfc5e-9b8e-4c39-a1f5-8d7e4fcf3f0f"]
    listed = http.get(f"{sim.admin_url}/_sim/runtimes", params={"tenant": TENANT}).json()
    assert [r["name"] for r in listed] == ["from-compass-manager"]
    assert http.get(f"{sim.admin_url}/_sim/runtimes", params={"tenant": "other"}).json() == []
    assert http.post(f"{sim.admin_url}/_sim/runtimes", json={"name": "x"}).status_code == 422


def test_counters_request_log_and_concurrency_over_http(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    director.result(REGISTER_RUNTIME, {"in": {"name": "counted"}})
    director.post(REGISTER_RUNTIME, {"in": {"name": "Not Valid"}})
    director.post(LIST_RUNTIMES)
    counters = http.get(f"{sim.admin_url}/_sim/counters").json()
    assert counters["registerRuntime"] == {
        "attempts": 2,
        "successes": 1,
        "errors": 1,
        "injected_errors": 0,
        "lost_responses": 0,
        "rate_limited": 0,
        "unavailable": 0,
    }
    assert counters["runtimes"]["successes"] == 1
    log = http.get(f"{sim.admin_url}/_sim/requests", params={"operation": "registerRuntime"}).json()
    assert [(r["outcome"], r["error_codes"], r["tenant"]) for r in log] == [
        ("ok", [], TENANT),
        ("error", [22], TENANT),
    ]
    errors = http.get(f"{sim.admin_url}/_sim/requests", params={"outcome": "error"}).json()
    assert len(errors) == 1
    later = http.get(f"{sim.admin_url}/_sim/requests", params={"since": log[0]["seq"]}).json()
    assert [r["operation"] for r in later] == ["registerRuntime", "runtimes"]
    assert http.get(f"{sim.admin_url}/_sim/requests", params={"outcome": "nope"}).status_code == 400
    concurrency = http.get(f"{sim.admin_url}/_sim/concurrency").json()
    assert concurrency["peak_active"] >= 1
    assert concurrency["limit"] is None


def test_reset_forgets_what_it_is_asked_to(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    director.result(REGISTER_RUNTIME, {"in": {"name": "kept"}})
    sim.set_faults(Faults(lost_responses={"runtime": 3}))
    assert http.post(f"{sim.admin_url}/_sim/reset", json={"state": False}).json() == {"ok": True}
    assert [r.name for r in sim.runtimes()] == ["kept"]
    assert sim.counters() == {}
    assert sim.faults() == Faults()
    assert http.post(f"{sim.admin_url}/_sim/reset").status_code == 200
    assert sim.runtimes() == []


def test_state_file_keeps_runtimes_and_tokens_across_a_restart(
    tmp_path: Path, http: httpx.Client
) -> None:
    state_file = tmp_path / "state" / "compass.json"
    config = SimConfig(client_id="id", client_secret="secret", state_file=state_file)
    with CompassSimulator(config).running() as first:
        access = fetch_token(http, first.token_url, client_id="id", client_secret="secret")
        client = DirectorClient(http, first.director_url, token=access, tenant=TENANT)
        runtime = client.result(REGISTER_RUNTIME, {"in": {"name": "durable", "labels": {"a": 1}}})
        ott = client.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime["id"]})["token"]
    saved = state_file.read_text()
    assert runtime["id"] in saved
    assert access not in saved
    assert ott not in saved

    with CompassSimulator(config).running() as second:
        client = DirectorClient(http, second.director_url, token=access, tenant=TENANT)
        [again] = client.result(LIST_RUNTIMES)["data"]
        assert again == runtime
        configuration = http.post(
            second.connector_url,
            json={"query": CONNECTOR_CONFIGURATION},
            headers={"Connector-Token": ott},
        ).json()
        assert configuration.get("errors") is None


def test_state_is_saved_soon_after_a_change(tmp_path: Path, http: httpx.Client) -> None:
    state_file = tmp_path / "compass.json"
    config = SimConfig(
        client_id="id",
        client_secret="secret",
        state_file=state_file,
        state_save_interval_seconds=0.05,
    )
    with CompassSimulator(config).running() as running:
        client = DirectorClient(
            http, running.director_url, token=running.issue_access_token(), tenant=TENANT
        )
        runtime_id = client.result(REGISTER_RUNTIME, {"in": {"name": "quick"}})["id"]
        deadline = time.monotonic() + 5
        while not (state_file.exists() and runtime_id in state_file.read_text()):
            assert time.monotonic() < deadline, "state file was not written"
            time.sleep(0.02)
        assert http.post(f"{running.admin_url}/_sim/save").json() == {"saved": True}


def test_save_without_state_file_does_nothing(sim: CompassSimulator, http: httpx.Client) -> None:
    assert http.post(f"{sim.admin_url}/_sim/save").json() == {"saved": False}


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "devenv.compass_sim", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_cli_help_lists_the_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devenv.compass_sim", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    for option in (
        "--host",
        "--port",
        "--client-id",
        "--client-secret",
        "--tenant",
        "--subaccount",
        "--consumer-type",
        "--state-file",
        "--ott-ttl",
        "--access-token-ttl",
        "--down",
        "--latency",
        "--error",
        "--lost-response",
        "--rate-limit",
        "--max-concurrent",
    ):
        assert option in result.stdout


def test_cli_serves_with_its_flags_until_terminated(tmp_path: Path) -> None:
    state_file = tmp_path / "cli-state.json"
    process = _run_cli(
        "--client-id",
        "cli",
        "--tenant",
        TENANT,
        "--subaccount",
        f"{TENANT}:sa-cli:cf-eu10",
        "--lost-response",
        "registerRuntime:1",
        "--state-file",
        str(state_file),
        "--log-level",
        "warning",
        env={"COMPASS_SIM_CLIENT_SECRET": "cli-secret"},
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        urls = json.loads(lines.get(timeout=30))
        with httpx.Client(timeout=10) as http:
            token = fetch_token(
                http, urls["token_url"], client_id="cli", client_secret="cli-secret"
            )
            client = DirectorClient(http, urls["director_url"], token=token, tenant=TENANT)
            other = client.post(REGISTER_RUNTIME, {"in": {"name": "x"}}, tenant="stranger")
            assert other.json()["errors"][0]["extensions"]["error_code"] == 25
            assert client.post(REGISTER_RUNTIME, {"in": {"name": "cli-runtime"}}).status_code == 504
            runtimes = http.get(f"{urls['admin_url']}/_sim/runtimes").json()
            assert [r["name"] for r in runtimes] == ["cli-runtime"]
            in_subaccount = client.result(
                REGISTER_RUNTIME,
                {"in": {"name": "sub", "labels": {"global_subaccount_id": "sa-cli"}}},
            )
            assert in_subaccount["labels"]["region"] == "cf-eu10"
            unknown = client.post(
                REGISTER_RUNTIME,
                {"in": {"name": "sub", "labels": {"global_subaccount_id": "sa-unknown"}}},
            )
            assert unknown.json()["errors"][0]["extensions"]["error_code"] == 20
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert "cli-runtime" in state_file.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        stdout.close()
        if process.stderr is not None:
            process.stderr.close()


def test_the_admin_url_the_demo_prints_answers_with_a_map_of_what_is_there(
    sim: CompassSimulator, http: httpx.Client
) -> None:
    index = http.get(f"{sim.admin_url}/_sim/")
    assert index.status_code == 200
    endpoints = index.json()["endpoints"]
    assert endpoints["/faults"] == ["DELETE", "GET", "HEAD", "PATCH", "PUT"]
    for path, methods in endpoints.items():
        if "GET" in methods:
            assert http.get(f"{sim.admin_url}/_sim{path}").status_code == 200, path
