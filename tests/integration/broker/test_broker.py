"""The broker against real API servers (KCP + two runtimes) and the Compass simulator.

Each test drives the broker process over HTTP and checks the outcome where it lands: in the
simulator's Director state and counters, and in the KCP objects. Every test fails if the
behaviour it names breaks.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from devenv.clusters import TestCluster
from devenv.compass_sim.faults import DownMode, Faults, Latency
from tests.integration.broker.conftest import (
    AGENT_NS,
    CLIENT_ID,
    CLIENT_SECRET,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)

PROBLEM = "urn:kyma-compass-pull:broker:problem:"


def director_runtimes(sim: Any, tenant: str) -> list[Any]:
    return list(sim.runtimes(tenant))


def attempts(sim: Any, operation: str) -> int:
    counter = sim.counters().get(operation)
    return 0 if counter is None else int(counter.attempts)


def total_attempts(sim: Any) -> int:
    return sum(int(c.attempts) for c in sim.counters().values())


def sync_marker_label(rt: Runtime, sim: Any) -> None:
    """Changes a Kyma label that feeds a Director label and waits until the leader wrote it:
    proof that the reconciler has been over the mapping since everything done before."""
    marker = "marker-plan"
    rt.patch_kyma({"metadata": {"labels": {"kyma-project.io/broker-plan-name": marker}}})
    wait_for(
        lambda: director_runtimes(sim, rt.tenant)[0].labels.get("broker_plan_name") == marker,
        what="the marker label in Director",
    )


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


# --- happy path, API surface, logs ---


def test_happy_path_registers_once_records_mapping_and_issues_tokens(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers()
    response = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"token", "connectorURL", "compassRuntimeID", "tenant", "expiresAt"}
    assert body["tenant"] == rt_a.tenant
    assert body["connectorURL"] == sim.connector_url

    [runtime] = director_runtimes(sim, rt_a.tenant)
    assert runtime.id == body["compassRuntimeID"]
    assert runtime.labels["kyma_runtime_id"] == rt_a.runtime_id
    for key in (
        "director_connection_managed_by",
        "broker_instance_id",
        "gardenerClusterName",
        "global_subaccount_id",
        "global_account_id",
        "broker_plan_id",
        "broker_plan_name",
    ):
        assert key in runtime.labels, key
    assert runtime.name == runtime.labels["gardenerClusterName"]

    # The status is written right after the answer (the agent does not wait for it).
    mapping = wait_for(
        lambda: (m := rt_a.mapping()) and (m.get("status") or {}).get("lastTokenIssuedAt") and m,
        what="the mapping's status after the token",
    )
    assert mapping["metadata"]["labels"]["kyma-project.io/compass-runtime-id"] == runtime.id
    assert mapping["metadata"]["labels"]["operator.kyma-project.io/kyma-name"] == rt_a.kyma_name
    assert mapping["metadata"]["labels"]["kyma-project.io/global-account-id"] == rt_a.tenant
    assert "kyma-project.io/cm-protection" in mapping["metadata"]["finalizers"]
    assert mapping["status"]["registered"] is True
    assert mapping["status"]["lastTokenIssuedAt"]
    assert {c["type"] for c in mapping["status"]["conditions"]} >= {"Registered", "TokenIssued"}

    again = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert again.status_code == 201
    assert again.json()["compassRuntimeID"] == runtime.id
    assert again.json()["token"] != body["token"]
    assert attempts(sim, "registerRuntime") == 1
    assert len(director_runtimes(sim, rt_a.tenant)) == 1

    # Events are written in the background: an answer never waits for its Event.
    wait_for(
        lambda: (
            {"RuntimeRegistered", "TokenIssued"}
            <= {e.reason for e in rt_a.kcp.core.list_namespaced_event(rt_a.namespace).items}
        ),
        what="the RuntimeRegistered and TokenIssued Events",
    )

    # The labels sent with registerRuntime are on record, so the reconciler finds nothing to
    # sync for a fresh registration. Shown without sleeping: a later Kyma label change is
    # synced, and it is the only Director label call; the reconcile that wrote it compared all
    # labels with the record, and every sweep before it found nothing to write either.
    wait_for(
        lambda: (rt_a.mapping() or {}).get("status", {}).get("directorLabels"),
        what="directorLabels on the mapping",
    )
    sync_marker_label(rt_a, sim)
    assert attempts(sim, "setRuntimeLabel") == 1


def test_health_ready_metrics_openapi(brokers: BrokerFactory) -> None:
    broker = brokers(BROKER_API_DOCS="true")
    assert httpx.get(f"{broker.url}/healthz").status_code == 200
    assert httpx.get(f"{broker.url}/readyz").status_code == 200
    spec = httpx.get(f"{broker.url}/openapi.json").json()
    assert "/v1/runtimes/{runtimeID}/token" in spec["paths"]
    broker.request_token("not_valid!", "x")
    metrics = httpx.get(f"{broker.url}/metrics").text
    assert 'broker_token_requests_total{outcome="malformed-request"} 1.0' in metrics


def check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "control_plane_broker", "--check-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_config_contacts_kcp_oauth_and_director_and_says_what_each_answered(
    brokers: BrokerFactory, tmp_path: Path
) -> None:
    env = brokers.env()
    out = check_config(env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        "compass-broker: ok: settings (BROKER_*) valid, credentials file readable"
    )
    said = "\n".join(out.stdout.splitlines()[1:])
    assert "ok: KCP https://127.0.0.1:" in said
    assert f"listed kymas and compassmanagermappings in {brokers.namespace}" in said
    assert "ok: OAuth token endpoint http://127.0.0.1:" in said
    assert "access token issued to client" in said
    assert "ok: Director http://127.0.0.1:" in said

    # Wrong secret: the token endpoint refuses; Director is not asked.
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(brokers.creds.read_text().replace("client_secret: ", "client_secret: not-"))
    out = check_config({**env, "BROKER_DIRECTOR_CREDENTIALS_FILE": str(wrong)})
    assert out.returncode == 1
    assert "FAILED: OAuth token endpoint http://127.0.0.1:" in out.stderr
    assert "FAILED: Director http://127.0.0.1:" in out.stderr
    assert "not-" not in out.stderr + out.stdout  # no part of the secret

    # Director's URL where nothing listens: its host and the cause.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = check_config({**env, "BROKER_DIRECTOR_URL": f"http://127.0.0.1:{port}/graphql"})
    assert out.returncode == 1
    assert (
        f"FAILED: Director http://127.0.0.1:{port}: ConnectError (http://127.0.0.1:{port}): "
        in (out.stderr)
    )


# --- identity ---


def expired_token(rt: Runtime) -> str:
    """A real token's claims, expired, signed with the runtime's real ServiceAccount key."""
    real = rt.token()
    header = jwt.get_unverified_header(real)
    claims = jwt.decode(real, options={"verify_signature": False})
    now = int(time.time())
    claims.update({"iat": now - 3600, "nbf": now - 3600, "exp": now - 1800})
    key = (rt.cluster.workdir / "pki" / "sa.key").read_bytes()
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": header["kid"]})


@pytest.mark.parametrize("mode", ["tokenreview", "jwks"])
def test_identity_failures_and_no_token_in_logs(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    runtime_b: TestCluster,
    sim: Any,
    mode: str,
) -> None:
    a = seed_runtime(control_plane, kcp_ns, runtime_a)
    b = seed_runtime(control_plane, kcp_ns, runtime_b)
    broker = brokers(BROKER_IDENTITY_MODE=mode)
    used: list[str] = []

    def ask(rt: Runtime, token: str | None) -> httpx.Response:
        if token:
            used.append(token)
        return broker.request_token(rt.runtime_id, token)

    # Runtime B's valid token presented for runtime A: A's API server / keys do not accept it,
    # yet it is a well-formed ServiceAccount token for our audience: another cluster's, 403.
    r = ask(a, b.token())
    assert r.status_code == 403, r.text
    assert problem_type(r) == "identity-forbidden"
    r = ask(a, a.token(audience="https://kubernetes.default.svc"))
    assert (r.status_code, problem_type(r)) == (401, "identity-not-proven")
    r = ask(a, expired_token(a))
    assert (r.status_code, problem_type(r)) == (401, "identity-not-proven")
    r = ask(a, a.token(sa="default", ns=AGENT_NS))
    assert (r.status_code, problem_type(r)) == (403, "identity-forbidden")
    r = ask(a, "garbage.not.a-token")
    assert r.status_code == 401
    r = ask(a, None)
    assert r.status_code == 401
    # Nothing of the above reached Director.
    assert attempts(sim, "registerRuntime") == attempts(sim, "requestOneTimeTokenForRuntime") == 0

    ok_a, ok_b = ask(a, a.token()), ask(b, b.token())
    assert ok_a.status_code == ok_b.status_code == 201
    issued = [ok_a.json()["token"], ok_b.json()["token"]]
    metrics = httpx.get(f"{broker.url}/metrics").text
    assert f'broker_identity_failures_total{{mode="{mode}"' in metrics

    broker.stop()
    text = "\n".join(broker.lines)
    assert "identity check failed" in text  # failures are logged ...
    for secret in [*used, *issued]:
        assert secret not in text  # ... never with a token
        assert secret[-20:] not in text


def test_xfcc_mode_trusts_cn_only_when_configured(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    runtime_b: TestCluster,
) -> None:
    a = seed_runtime(control_plane, kcp_ns, runtime_a)
    b = seed_runtime(control_plane, kcp_ns, runtime_b)

    def xfcc(cn: str) -> dict[str, str]:
        return {"X-Forwarded-Client-Cert": f'Hash=abc;Subject="O=kyma,CN={cn}";URI='}

    trusted = brokers(BROKER_IDENTITY_MODE="xfcc", BROKER_XFCC_TRUSTED="true")
    r = trusted.request_token(a.runtime_id, headers=xfcc(b.runtime_id))
    assert (r.status_code, problem_type(r)) == (403, "identity-forbidden")  # B's cert for A
    assert trusted.request_token(a.runtime_id, headers=xfcc(a.runtime_id)).status_code == 201
    untrusted = brokers(BROKER_IDENTITY_MODE="xfcc")
    r = untrusted.request_token(a.runtime_id, headers=xfcc(a.runtime_id))
    assert r.status_code == 401


# --- policy ---


def test_unknown_runtime_malformed_id_module_off_and_deleting(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    rt_a: Runtime,
    sim: Any,
) -> None:
    off = seed_runtime(control_plane, kcp_ns, runtime_a, modules=())
    broker = brokers()
    # Who cannot prove to be a runtime learns nothing about it: an unknown runtime ID and a
    # known one with a proof that does not hold get the same answer.
    unknown = broker.request_token("0b5d2a6e-0000-4000-8000-00000000dead", rt_a.token())
    assert (unknown.status_code, problem_type(unknown)) == (401, "identity-not-proven")
    forged = broker.request_token(rt_a.runtime_id, "not-a-token")
    assert (forged.status_code, problem_type(forged)) == (401, "identity-not-proven")
    r = broker.request_token('x"}},{"key', rt_a.token())
    assert r.status_code in (400, 404)  # 404 when the router already refuses the path
    r = broker.request_token("a" * 64, rt_a.token())
    assert (r.status_code, problem_type(r)) == (400, "malformed-request")
    r = broker.request_token(off.runtime_id, off.token())
    assert (r.status_code, problem_type(r)) == (409, "module-not-enabled")

    # Module enabled only in status.modules counts as enabled.
    off.kcp.custom.patch_namespaced_custom_object_status(
        "operator.kyma-project.io",
        "v1beta2",
        kcp_ns,
        "kymas",
        off.kyma_name,
        {"status": {"modules": [{"name": "application-connector", "state": "Ready"}]}},
    )
    wait_for(
        lambda: broker.request_token(off.runtime_id, off.token()).status_code == 201,
        what="status.modules to count",
    )

    rt_a.patch_kyma({"metadata": {"finalizers": ["test.kyma-project.io/hold"]}})
    rt_a.delete_kyma()
    r = wait_for(
        lambda: (
            (resp := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 409
            and resp
        ),
        what="deleting Kyma to be refused",
    )
    assert problem_type(r) == "kyma-deleting"
    rt_a.patch_kyma({"metadata": {"finalizers": []}})
    # No Kyma: answered from the Kyma cache, before any request, with the 401 any failed proof
    # gets (its kubeconfig Secret still there or not); issue 28 item 2.
    r = wait_for(
        lambda: (
            (resp := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 401
            and resp
        ),
        what="a runtime without a Kyma to get 401",
    )
    assert problem_type(r) == "identity-not-proven"
    assert r.json()["detail"] == unknown.json()["detail"]
    # Random runtime IDs cost no KCP request: 500 of them made 500 Secret GETs before (counted
    # by the KCP API server itself; nothing else here reads Secrets).
    reads = _secret_gets(control_plane)
    for _ in range(200):
        r = broker.request_token(str(uuid.uuid4()), rt_a.token())
        assert (r.status_code, r.json()["detail"]) == (401, unknown.json()["detail"])
    assert _secret_gets(control_plane) == reads


def _secret_gets(cluster: TestCluster) -> float:
    """GETs of Secrets the API server has answered (its own request counter)."""
    api = cluster.api_client
    response = api.call_api("GET", api.configuration.host + "/metrics")
    response.read()
    text = response.data.decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
        and 'resource="secrets"' in line
        and 'verb="GET"' in line
    )


def test_per_runtime_rate_limit_gives_429_with_retry_after(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_b: TestCluster,
    rt_a: Runtime,
    sim: Any,
) -> None:
    b = seed_runtime(control_plane, kcp_ns, runtime_b)
    broker = brokers(BROKER_RATE_LIMIT_BURST="2", BROKER_RATE_LIMIT_PER_MINUTE="1")
    for _ in range(2):
        assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    issued = attempts(sim, "requestOneTimeTokenForRuntime")
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert (r.status_code, problem_type(r)) == (429, "rate-limited")
    # a minute per token at 1/min, minus the time spent, plus up to 2 s of jitter
    assert 30 <= int(r.headers["Retry-After"]) <= 60 + 2 + 1
    assert attempts(sim, "requestOneTimeTokenForRuntime") == issued  # refused before Director
    # The limit is per runtime: B is not affected.
    assert broker.request_token(b.runtime_id, b.token()).status_code == 201


def test_callers_that_hang_up_while_queued_for_director_cost_no_token(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    """After a restart thousands of agents give up while their requests wait for Director; a
    token requested for one of them would be spent on nobody while the others wait longer."""
    broker = brokers(BROKER_DIRECTOR_MAX_CONCURRENCY="1")
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    sim.set_faults(Faults(latency=Latency(fixed_seconds=1.0, endpoints=frozenset({"director"}))))
    before = attempts(sim, "requestOneTimeTokenForRuntime")
    url = f"{broker.url}/v1/runtimes/{rt_a.runtime_id}/token"
    auth = {"Authorization": f"Bearer {rt_a.token()}"}

    async def fire() -> tuple[httpx.Response, list[BaseException | httpx.Response]]:
        async with (
            httpx.AsyncClient(timeout=30) as patient,
            httpx.AsyncClient(timeout=0.5) as hasty,
        ):
            first = asyncio.create_task(patient.post(url, headers=auth))
            await asyncio.sleep(0.2)  # it holds the only slot for a second
            gave_up = await asyncio.gather(
                *(hasty.post(url, headers=auth) for _ in range(3)), return_exceptions=True
            )
            return await first, gave_up

    first, gave_up = asyncio.run(fire())
    assert first.status_code == 201, first.text
    assert all(isinstance(r, httpx.ReadTimeout) for r in gave_up), gave_up
    wait_for(
        lambda: 'broker_token_requests_total{outcome="caller-gone"} 3.0' in broker.metrics(),
        what="the three abandoned requests to end without a token",
    )
    assert attempts(sim, "requestOneTimeTokenForRuntime") == before + 1


# --- Compass outages ---


def test_director_down_gives_503_and_breaker_stops_calls(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(BROKER_BREAKER_FAILURE_THRESHOLD="2", BROKER_BREAKER_OPEN_SECONDS="3")
    sim.set_faults(Faults(down=DownMode.UNAVAILABLE))
    for _ in range(2):
        r = broker.request_token(rt_a.runtime_id, rt_a.token())
        assert (r.status_code, problem_type(r)) == (503, "compass-unavailable")
        assert int(r.headers["Retry-After"]) >= 1
    calls_when_open = total_attempts(sim)
    started = time.monotonic()
    for _ in range(5):
        r = broker.request_token(rt_a.runtime_id, rt_a.token())
        assert r.status_code == 503
        assert 1 <= int(r.headers["Retry-After"]) <= 3 + 2 + 1  # open time + jitter
    assert time.monotonic() - started < 3  # answered at once
    assert total_attempts(sim) == calls_when_open  # not one call while open

    sim.clear_faults()
    r = wait_for(
        lambda: (
            (resp := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 201
            and resp
        ),
        timeout=15,
        interval=0.5,
        what="recovery after the breaker's open period",
    )
    assert len(director_runtimes(sim, rt_a.tenant)) == 1
    assert r.json()["compassRuntimeID"] == director_runtimes(sim, rt_a.tenant)[0].id


def test_a_claim_that_lapsed_while_director_was_down_registers_without_a_lookup(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    sim: Any,
) -> None:
    # The broker's own claim lapsed during the outage and nobody took it since: no attempt
    # can have reached Director, so the runtime is registered at once, not looked up first.
    broker = brokers(
        BROKER_DIRECTOR_TIMEOUT_SECONDS="1",
        BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS="1",
        BROKER_REGISTRATION_CLAIM_SECONDS="5",
        BROKER_BREAKER_FAILURE_THRESHOLD="1",
        BROKER_BREAKER_OPEN_SECONDS="1",
    )
    # Certainly new: its Kyma is created after the broker's mapping watch listed (clock skew
    # allowance: 2 s), so no mapping of it can have existed unseen.
    time.sleep(3)
    rt_a = seed_runtime(control_plane, kcp_ns, runtime_a)
    sim.set_faults(Faults(down=DownMode.UNAVAILABLE))
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert (r.status_code, problem_type(r)) == (503, "compass-unavailable")
    claimed = rt_a.mapping()
    assert claimed is not None
    assert "kyma-project.io/compass-runtime-id" not in claimed["metadata"].get("labels", {})
    time.sleep(5.5)  # the claim lapses
    sim.clear_faults()
    wait_for(
        lambda: broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201,
        timeout=15,
        interval=0.5,
        what="a token once Director is back",
    )
    assert attempts(sim, "registerRuntime") == 1
    assert attempts(sim, "runtimes") == 0
    assert len(director_runtimes(sim, rt_a.tenant)) == 1


def test_a_kyma_older_than_the_broker_is_looked_up_before_it_is_registered(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    # Its Kyma existed before this broker looked: a mapping of it may have been force-deleted
    # while no broker ran, so Director is asked first (by our label, then by the shoot's).
    broker = brokers()
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    assert attempts(sim, "runtimes") == 2
    assert attempts(sim, "registerRuntime") == 1


def test_lost_register_response_leaves_one_runtime(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers()
    sim.set_faults(Faults(lost_responses={"registerRuntime": 1}))
    first = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert first.status_code == 503, first.text
    assert len(director_runtimes(sim, rt_a.tenant)) == 1  # it took effect although lost
    second = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert second.status_code == 201, second.text
    [runtime] = director_runtimes(sim, rt_a.tenant)
    assert second.json()["compassRuntimeID"] == runtime.id
    assert attempts(sim, "registerRuntime") == 1


# --- exactly once across replicas and crashes ---


def test_two_brokers_fifty_concurrent_requests_one_registration(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    one, two = brokers(), brokers()
    # Slow Director calls widen the window in which both replicas race.
    sim.set_faults(Faults(latency=Latency(fixed_seconds=0.3, endpoints=frozenset({"director"}))))
    token = rt_a.token()

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{(one if i % 2 else two).url}/v1/runtimes/{rt_a.runtime_id}/token",
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    for i in range(50)
                )
            )

    responses = asyncio.run(fire())
    statuses = [r.status_code for r in responses]
    assert statuses.count(201) == 50, statuses
    assert attempts(sim, "registerRuntime") == 1
    assert len(director_runtimes(sim, rt_a.tenant)) == 1
    # One registration, shared; but a one-time token is for one caller only: each got its own.
    assert attempts(sim, "requestOneTimeTokenForRuntime") == 50
    assert len({r.json()["token"] for r in responses}) == 50
    assert len({r.json()["compassRuntimeID"] for r in responses}) == 1


def test_crash_between_register_and_record_then_restart_no_duplicate(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    fast = {
        "BROKER_DIRECTOR_TIMEOUT_SECONDS": "1",
        "BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS": "0.5",
        "BROKER_REGISTRATION_CLAIM_SECONDS": "5",
    }
    crashing = brokers(TEST_BROKER_CRASH_AFTER_REGISTER="1", **fast)
    with pytest.raises(httpx.TransportError):
        crashing.request_token(rt_a.runtime_id, rt_a.token())
    assert crashing.wait_exit() == 70
    [runtime] = director_runtimes(sim, rt_a.tenant)  # registered ...
    mapping = rt_a.mapping()
    assert mapping is not None
    assert "kyma-project.io/compass-runtime-id" not in mapping["metadata"].get(
        "labels", {}
    )  # ... not recorded

    restarted = brokers(**fast)
    r = wait_for(
        lambda: (
            (resp := restarted.request_token(rt_a.runtime_id, rt_a.token())).status_code == 201
            and resp
        ),
        timeout=20,
        interval=0.5,
        what="the dead replica's claim to expire",
    )
    assert r.json()["compassRuntimeID"] == runtime.id
    assert attempts(sim, "registerRuntime") == 1
    assert len(director_runtimes(sim, rt_a.tenant)) == 1
    # The status is written right after the answer (the agent does not wait for it).
    mapping = wait_for(
        lambda: (m := rt_a.mapping()) and (m.get("status") or {}).get("lastTokenIssuedAt") and m,
        what="the mapping's status after the token",
    )
    assert mapping["metadata"]["labels"]["kyma-project.io/compass-runtime-id"] == runtime.id


def test_crash_between_register_and_record_then_kyma_deleted_leaves_no_orphan(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    """Issue 11 item 14: the broker dies after Director registered the runtime and before the
    mapping recorded it; the Kyma is deleted while no broker runs. The next leader must find
    the runtime by the ID as written on the Kyma (upper case here), not by the mapping's
    lower-cased name, and unregister it before the mapping goes."""
    assert rt_a.runtime_id != rt_a.runtime_id.lower()  # the case that used to be lost
    fast = {
        "BROKER_DIRECTOR_TIMEOUT_SECONDS": "1",
        "BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS": "0.5",
        "BROKER_REGISTRATION_CLAIM_SECONDS": "5",
    }
    crashing = brokers(TEST_BROKER_CRASH_AFTER_REGISTER="1", **fast)
    with pytest.raises(httpx.TransportError):
        crashing.request_token(rt_a.runtime_id, rt_a.token())
    assert crashing.wait_exit() == 70
    assert len(director_runtimes(sim, rt_a.tenant)) == 1
    rt_a.delete_kyma()
    wait_for(lambda: rt_a.kyma() is None, what="the Kyma to be gone")

    brokers(**fast)
    wait_for(
        lambda: rt_a.mapping() is None,
        timeout=30,
        interval=0.5,
        what="the sweep to unregister the orphan and remove the mapping",
    )
    assert director_runtimes(sim, rt_a.tenant) == []
    assert attempts(sim, "unregisterRuntime") == 1


# --- reconciler ---


def test_kyma_deleted_unregisters_and_removes_mapping(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers()
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    rt_a.delete_kyma()
    wait_for(lambda: not director_runtimes(sim, rt_a.tenant), what="unregistration")
    wait_for(lambda: rt_a.mapping() is None, what="mapping removal")
    assert attempts(sim, "unregisterRuntime") == 1
    events = rt_a.kcp.core.list_namespaced_event(rt_a.namespace).items
    assert "RuntimeUnregistered" in {e.reason for e in events}


def test_kyma_deleted_while_broker_stopped_is_swept(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers()
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    assert broker.stop() == 0  # clean SIGTERM shutdown
    rt_a.delete_kyma()
    assert len(director_runtimes(sim, rt_a.tenant)) == 1  # no broker runs to notice
    brokers()
    wait_for(lambda: not director_runtimes(sim, rt_a.tenant), what="the sweep to unregister")
    wait_for(lambda: rt_a.mapping() is None, what="mapping removal")


def _register_like_compass_manager(sim: Any, rt: Runtime) -> str:
    token = httpx.post(
        sim.token_url,
        data={"grant_type": "client_credentials", "scope": "runtime:read runtime:write"},
        auth=(CLIENT_ID, CLIENT_SECRET),
    ).json()["access_token"]
    labels = rt.kyma()["metadata"]["labels"]  # type: ignore[index]
    response = httpx.post(
        sim.director_url,
        headers={"Authorization": f"Bearer {token}", "Tenant": rt.tenant},
        json={
            "query": "mutation($in: RuntimeRegisterInput!) { registerRuntime(in: $in) { id } }",
            "variables": {
                "in": {
                    # compass-manager's `<shoot>-<random letters>`, upper case included
                    "name": "cm-registered-AbCdEf",
                    "labels": {
                        "director_connection_managed_by": "compass-manager",
                        "global_account_id": rt.tenant,
                        "global_subaccount_id": labels["kyma-project.io/subaccount-id"],
                        "broker_instance_id": "some-other-instance",
                        "gardenerClusterName": "cm-registered",
                    },
                }
            },
        },
    )
    return str(response.json()["data"]["registerRuntime"]["id"])


def test_compass_manager_mapping_adopted_and_labels_synced(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    compass_id = _register_like_compass_manager(sim, rt_a)
    labels = rt_a.kyma()["metadata"]["labels"]  # type: ignore[index]
    rt_a.kcp.custom.create_namespaced_custom_object(
        "operator.kyma-project.io",
        "v1beta1",
        rt_a.namespace,
        "compassmanagermappings",
        {
            "apiVersion": "operator.kyma-project.io/v1beta1",
            "kind": "CompassManagerMapping",
            "metadata": {
                "name": rt_a.kyma_name,
                "labels": {
                    "operator.kyma-project.io/kyma-name": rt_a.kyma_name,
                    "kyma-project.io/compass-runtime-id": compass_id,
                    "kyma-project.io/global-account-id": rt_a.tenant,
                    "kyma-project.io/subaccount-id": labels["kyma-project.io/subaccount-id"],
                },
                "finalizers": ["kyma-project.io/cm-protection"],
            },
        },
    )
    registrations_before = attempts(sim, "registerRuntime")
    broker = brokers()

    # The leader brings Director's labels in line with the Kyma (ours added, theirs corrected).
    def synced() -> bool:
        [rt] = director_runtimes(sim, rt_a.tenant)
        return (
            rt.labels.get("kyma_runtime_id") == rt_a.runtime_id
            and rt.labels.get("broker_instance_id") == labels["kyma-project.io/instance-id"]
        )

    wait_for(synced, what="labels of the adopted runtime")
    # The reconciler has been over the mapping, yet no token was requested: tokens only on ask.
    assert attempts(sim, "requestOneTimeTokenForRuntime") == 0

    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert r.status_code == 201, r.text
    assert r.json()["compassRuntimeID"] == compass_id
    assert attempts(sim, "registerRuntime") == registrations_before
    assert [(x.id, x.name) for x in director_runtimes(sim, rt_a.tenant)] == [
        (compass_id, "cm-registered-AbCdEf")
    ]

    # A later change of a Kyma label that feeds a Director label is synced too.
    rt_a.patch_kyma({"metadata": {"labels": {"kyma-project.io/broker-plan-name": "aws"}}})
    wait_for(
        lambda: director_runtimes(sim, rt_a.tenant)[0].labels.get("broker_plan_name") == "aws",
        what="label change",
    )


@pytest.mark.parametrize("policy", ["keep", "unregister"])
def test_module_disabled_keeps_or_unregisters_by_policy(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any, policy: str
) -> None:
    broker = brokers(BROKER_MODULE_DISABLED_POLICY=policy)
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    rt_a.patch_kyma({"spec": {"modules": []}})
    r = wait_for(
        lambda: (
            (resp := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 409
            and resp
        ),
        what="tokens to be refused",
    )
    assert problem_type(r) == "module-not-enabled"
    if policy == "unregister":
        wait_for(lambda: not director_runtimes(sim, rt_a.tenant), what="unregistration")
        wait_for(lambda: rt_a.mapping() is None, what="mapping removal")
    else:
        # The leader reconciles the mapping after the module went off (the marker is written
        # by a reconcile that reads the Kyma with the module off), and keeps the registration.
        sync_marker_label(rt_a, sim)
        assert len(director_runtimes(sim, rt_a.tenant)) == 1
        assert attempts(sim, "unregisterRuntime") == 0
        assert rt_a.mapping() is not None
