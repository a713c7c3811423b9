"""The real Director stack answers as Compass does: OAuth token, tenant mapping, labels Director
adds, errors, lost answers after Director acted, call counts, and the command's clean stop.

Requests are plain httpx with the broker's own GraphQL documents; Director's database is the
judge of what happened.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from control_plane_broker.director import documents
from control_plane_broker.settings import load_director_credentials
from devenv.real_director import RealCompass
from devenv.runtime_agent_sim import ExchangeError, exchange_token
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import wait_for

# The first use builds Director when `make real-compass` has not (minutes on a cold cache).
pytestmark = pytest.mark.timeout(600)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def token(real_compass: RealCompass, http: httpx.Client) -> str:
    response = http.post(
        real_compass.token_url,
        auth=(real_compass.client_id, real_compass.client_secret),
        data={"grant_type": "client_credentials", "scope": "runtime:read runtime:write"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_type"] == "bearer"
    assert body["expires_in"] > 0
    return str(body["access_token"])


def _graphql(
    http: httpx.Client,
    stack: RealCompass,
    token: str,
    tenant: str,
    document: str,
    variables: dict[str, Any],
) -> httpx.Response:
    return http.post(
        stack.director_url,
        headers={"Authorization": f"Bearer {token}", "Tenant": tenant},
        json={"query": document, "variables": variables},
    )


def _register(
    http: httpx.Client, stack: RealCompass, token: str, tenant: str, labels: dict[str, Any]
) -> httpx.Response:
    return _graphql(
        http,
        stack,
        token,
        tenant,
        documents.REGISTER_RUNTIME,
        {"in": {"name": _unique("kyma"), "labels": labels}},
    )


def test_register_runtime_through_the_gateway_gets_the_labels_director_adds(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account, subaccount = _unique("ga"), _unique("sa")
    real_compass.add_global_account(account)
    real_compass.add_subaccount(subaccount, parent=account, region="cf-eu10")
    runtime_id = _unique("rt")

    response = _register(
        http,
        real_compass,
        token,
        account,
        {"kyma_runtime_id": runtime_id, "global_subaccount_id": subaccount},
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert "errors" not in body, body
    answered = body["data"]["registerRuntime"]
    assert answered["labels"]["runtimeType"] == "kyma"
    assert answered["labels"]["region"] == "cf-eu10"
    assert answered["labels"]["kyma_runtime_id"] == runtime_id
    stored = real_compass.runtimes(label_key="kyma_runtime_id", label_value=runtime_id)
    assert [r["id"] for r in stored] == [answered["id"]]
    assert stored[0]["labels"]["runtimeType"] == "kyma"
    # The subaccount owns it and the global account sees it through the tenant tree.
    tenants = real_compass.runtime_tenants(answered["id"])
    assert tenants.get(subaccount) is True
    assert account in tenants


def test_a_runtime_without_subaccount_gets_an_empty_region(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    runtime_id = _unique("rt")

    response = _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})

    assert response.status_code == 200, response.text
    labels = response.json()["data"]["registerRuntime"]["labels"]
    assert labels["region"] == ""
    assert labels["runtimeType"] == "kyma"


def test_one_time_token_carries_the_connector_url_we_chose(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    registered = _register(http, real_compass, token, account, {"kyma_runtime_id": _unique("rt")})
    runtime = registered.json()["data"]["registerRuntime"]

    response = _graphql(
        http, real_compass, token, account, documents.REQUEST_OTT, {"id": runtime["id"]}
    )

    assert response.status_code == 200, response.text
    ott = response.json()["data"]["requestOneTimeTokenForRuntime"]
    assert ott["connectorURL"] == real_compass.connector_url
    assert ott["used"] is False
    assert len(ott["token"]) == 88


def test_an_unknown_tenant_is_http_400_code_25(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    stranger = _unique("unknown-ga")

    response = _register(http, real_compass, token, stranger, {"kyma_runtime_id": _unique("rt")})

    assert response.status_code == 400, response.text
    errors = response.json()["errors"]
    assert errors[0]["extensions"]["error_code"] == 25
    assert stranger in errors[0]["message"]


def test_a_tenant_added_after_a_miss_is_found(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    late = _unique("late-ga")
    first = _register(http, real_compass, token, late, {"kyma_runtime_id": _unique("rt")})
    assert first.status_code == 400

    # Written straight to the database, as the tenant fetcher would: the gateway must not
    # have remembered the miss.
    real_compass.query(
        "INSERT INTO business_tenant_mappings (id, external_name, external_tenant, "
        "provider_name, type) VALUES (gen_random_uuid(), :'ext', :'ext', 'test', 'account')",
        ext=late,
    )
    second = _register(http, real_compass, token, late, {"kyma_runtime_id": _unique("rt")})

    assert second.status_code == 200, second.text
    assert "errors" not in second.json()


def test_only_tokens_the_gateway_issued_pass(real_compass: RealCompass, http: httpx.Client) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    before = real_compass.calls()

    forged = _register(http, real_compass, "not-a-token", account, {})
    wrong_secret = http.post(
        real_compass.token_url,
        auth=(real_compass.client_id, "wrong"),
        data={"grant_type": "client_credentials"},
    )
    too_much = http.post(
        real_compass.token_url,
        auth=(real_compass.client_id, real_compass.client_secret),
        data={"grant_type": "client_credentials", "scope": "runtime:read tenant:write"},
    )

    assert forged.status_code == 401
    assert wrong_secret.status_code == 401
    assert wrong_secret.json()["error"] == "invalid_client"
    assert too_much.status_code == 400
    assert too_much.json()["error"] == "invalid_scope"
    assert real_compass.calls() == before  # Director never saw the forged call


def test_a_read_only_token_cannot_register(real_compass: RealCompass, http: httpx.Client) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    response = http.post(
        real_compass.token_url,
        auth=(real_compass.client_id, real_compass.client_secret),
        data={"grant_type": "client_credentials", "scope": "runtime:read"},
    )
    read_only = response.json()["access_token"]
    runtime_id = _unique("rt")

    refused = _register(http, real_compass, read_only, account, {"kyma_runtime_id": runtime_id})

    body = refused.json()
    assert body["errors"][0]["extensions"]["error_code"] == 23  # insufficient scopes
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=runtime_id) == 0


def test_a_lost_answer_leaves_the_runtime_registered_in_director(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    lost_id, next_id = _unique("rt"), _unique("rt")
    lost_before = real_compass.lost().get("registerRuntime", 0)
    real_compass.lose_answers("registerRuntime", count=1)
    try:
        lost = _register(http, real_compass, token, account, {"kyma_runtime_id": lost_id})
        answered = _register(http, real_compass, token, account, {"kyma_runtime_id": next_id})
    finally:
        real_compass.clear_faults()

    # The caller saw what a gateway says when its upstream times out ...
    assert lost.status_code == 504
    assert lost.text == "upstream request timeout"
    # ... while Director registered the runtime all the same.
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=lost_id) == 1
    # The count was one: the next call is answered.
    assert answered.status_code == 200
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=next_id) == 1
    assert real_compass.lost().get("registerRuntime", 0) == lost_before + 1


def test_a_dropped_connection_after_director_acted(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    runtime_id = _unique("rt")
    real_compass.lose_answers("RegisterRuntime", mode="drop")  # by operation name this time
    try:
        with pytest.raises(httpx.TransportError):
            _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})
    finally:
        real_compass.clear_faults()

    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=runtime_id) == 1


def test_lost_answers_follow_the_ratio(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    ids = [_unique("rt") for _ in range(12)]
    real_compass.lose_answers("registerRuntime", ratio=0.5)
    try:
        statuses = [
            _register(http, real_compass, token, account, {"kyma_runtime_id": rid}).status_code
            for rid in ids
        ]
    finally:
        real_compass.clear_faults()

    # 12 calls at one half: all failing or none failing is a 1 in 2,048 chance.
    assert 0 < statuses.count(504) < len(ids)
    assert set(statuses) == {200, 504}
    assert all(
        real_compass.runtime_count(label_key="kyma_runtime_id", label_value=rid) == 1 for rid in ids
    )


def test_calls_are_counted_per_operation(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    before = real_compass.calls()

    runtime_id = _unique("rt")
    _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})
    _register(http, real_compass, token, account, {"kyma_runtime_id": _unique("rt")})
    listed = _graphql(
        http,
        real_compass,
        token,
        account,
        documents.RUNTIMES_BY_LABEL,
        {"filter": [{"key": "kyma_runtime_id", "query": f'"{runtime_id}"'}], "first": 10},
    )

    after = real_compass.calls()
    assert listed.status_code == 200, listed.text
    assert [r["labels"]["kyma_runtime_id"] for r in listed.json()["data"]["runtimes"]["data"]] == [
        runtime_id
    ]
    assert after.get("registerRuntime", 0) - before.get("registerRuntime", 0) == 2
    assert after.get("runtimes", 0) - before.get("runtimes", 0) == 1
    # The admin API tells the same to a stack run as a separate process.
    admin = http.get(f"{real_compass.gateway_url}/_gateway/calls").json()
    assert admin["calls"]["registerRuntime"] >= after["registerRuntime"]


def test_the_admin_api_sets_and_clears_faults(
    real_compass: RealCompass, http: httpx.Client
) -> None:
    base = f"{real_compass.gateway_url}/_gateway/faults"
    bad = http.put(base, json={"operation": "registerRuntime", "ratio": 2})
    put = http.put(base, json={"operation": "unregisterRuntime", "count": 2, "mode": "drop"})
    listed = http.get(base).json()
    cleared = http.delete(base)

    assert bad.status_code == 400
    assert put.status_code == 200
    assert listed["lose_answers"] == [
        {"operation": "unregisterRuntime", "ratio": 1.0, "remaining": 2, "mode": "drop"}
    ]
    assert cleared.status_code == 204
    assert http.get(base).json()["lose_answers"] == []


def test_the_credentials_file_is_what_the_broker_reads(
    real_compass: RealCompass, http: httpx.Client, tmp_path: Path
) -> None:
    path = real_compass.write_credentials_file(tmp_path / "credentials.yaml")

    credentials = load_director_credentials(path)
    response = http.post(
        credentials.tokens_endpoint,
        auth=(credentials.client_id, credentials.client_secret),
        data={"grant_type": "client_credentials"},
    )

    assert response.status_code == 200, response.text
    assert credentials.client_id == real_compass.client_id


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_command_stops_everything_it_started_on_sigterm(
    real_compass: RealCompass, tmp_path: Path
) -> None:
    """Runs after the fixture, so the build is done and the cached database template exists."""
    workdir = tmp_path / "cli"
    credentials = tmp_path / "credentials.yaml"
    pids: dict[str, int] = {}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devenv.real_director",
            "--workdir",
            str(workdir),
            "--subaccount",
            "cli-sa:cli-ga:eu-1",
            "--credentials-file",
            str(credentials),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until ready (or the command died)
            assert line, f"no JSON line; stderr:\n{proc.stderr.read() if proc.stderr else ''}"
            started = json.loads(line)
            pids = started["pids"]
            assert set(pids) == {"director", "postgres", "etcd", "kube-apiserver"}
            assert all(_alive(pid) for pid in pids.values())
            token = httpx.post(
                started["token_url"],
                auth=(started["client_id"], started["client_secret"]),
                data={"grant_type": "client_credentials"},
            ).json()["access_token"]
            registered = httpx.post(
                started["director_url"],
                headers={"Authorization": f"Bearer {token}", "Tenant": "cli-ga"},
                json={
                    "query": documents.REGISTER_RUNTIME,
                    "variables": {
                        "in": {"name": "cli", "labels": {"global_subaccount_id": "cli-sa"}}
                    },
                },
                timeout=30,
            )
            assert registered.json()["data"]["registerRuntime"]["labels"]["region"] == "eu-1"
            assert load_director_credentials(credentials).client_id == started["client_id"]

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {name for name, pid in pids.items() if _alive(pid)} == set()


def _one_time_token(http: httpx.Client, stack: RealCompass, token: str) -> tuple[str, str, str]:
    """(runtime ID, one-time token, global account) for a runtime registered for this test."""
    account, subaccount = _unique("ga"), _unique("sa")
    stack.add_global_account(account)
    stack.add_subaccount(subaccount, parent=account, region="cf-eu10")
    registered = _register(
        http,
        stack,
        token,
        account,
        {"kyma_runtime_id": _unique("rt"), "global_subaccount_id": subaccount},
    )
    runtime_id = registered.json()["data"]["registerRuntime"]["id"]
    response = _graphql(http, stack, token, account, documents.REQUEST_OTT, {"id": runtime_id})
    assert response.status_code == 200, response.text
    return runtime_id, response.json()["data"]["requestOneTimeTokenForRuntime"]["token"], account


def _one_time_token_row(stack: RealCompass, runtime_id: str) -> tuple[str, dict[str, Any]]:
    """(SystemAuth ID, its OneTimeToken) as Director stores them."""
    ((auth_id, value),) = stack.query(
        "SELECT id, value::text FROM system_auths WHERE runtime_id = :'id'", id=runtime_id
    )
    return auth_id, json.loads(value)["OneTimeToken"]


def test_the_gateways_connector_takes_directors_one_time_token_once(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    runtime_id, one_time, _ = _one_time_token(http, real_compass, token)
    connector = f"{real_compass.gateway_url}/connector/graphql"
    auth_id, stored = _one_time_token_row(real_compass, runtime_id)
    assert (stored["Token"], stored["Used"]) == (one_time, False)

    issued = exchange_token(http, connector, one_time)

    # Named as the real Connector names it: CN = the SystemAuth holding the token.
    certificate = x509.load_pem_x509_certificate(issued.client_pem)
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in common_names] == [auth_id]
    # Director's row: the CSR token Director put on the same SystemAuth, spent by the signing.
    same_auth, stored = _one_time_token_row(real_compass, runtime_id)
    assert same_auth == auth_id
    assert stored["Token"] != one_time
    assert stored["Used"] is True
    assert not stored["UsedAt"].startswith("0001-")
    assert _gateway_spent(real_compass, runtime_id) == 2
    # One-time: the same token again is refused as Compass refuses it: HTTP 400, no body.
    with pytest.raises(ExchangeError) as refused:
        exchange_token(http, connector, one_time)
    assert str(refused.value) == "graphql: server returned a non-200 status code: 400"
    assert _gateway_spent(real_compass, runtime_id) == 2


def _gateway_spent(stack: RealCompass, runtime_id: str) -> int:
    """Tokens of the runtime spent at the gateway's Connector (not at the real one)."""
    connector = stack.gateway.connector
    assert connector is not None
    return connector.spent(runtime_id)


def test_the_gateways_connector_refuses_an_expired_token_and_leaves_it_unused(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    runtime_id, one_time, _ = _one_time_token(http, real_compass, token)
    real_compass.query(
        "UPDATE system_auths SET value = jsonb_set(value, '{OneTimeToken,ExpiresAt}', "
        "'\"2020-01-01T00:00:00Z\"') WHERE runtime_id = :'id' RETURNING id",
        id=runtime_id,
    )
    response = http.post(
        f"{real_compass.gateway_url}/connector/graphql",
        headers={"Connector-Token": one_time},
        json={"query": "{ configuration { token { token } } }"},
    )
    assert (response.status_code, response.content) == (400, b"")
    assert _one_time_token_row(real_compass, runtime_id)[1]["Used"] is False
    assert _gateway_spent(real_compass, runtime_id) == 0


def test_calls_are_counted_per_tenant(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    _, _, account = _one_time_token(http, real_compass, token)
    assert real_compass.calls(account) == {"registerRuntime": 1, "requestOneTimeTokenForRuntime": 1}
    assert real_compass.calls(_unique("ga")) == {}


@pytest.mark.parametrize("mode", ["503", "drop", "refuse"])
def test_compass_down_and_back(
    real_compass: RealCompass, http: httpx.Client, token: str, mode: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    runtime_id = _unique("rt")
    try:
        real_compass.set_down(mode)  # type: ignore[arg-type]  # one of the three
        if mode == "503":
            down = _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})
            assert (down.status_code, down.text) == (503, "no healthy upstream")
        else:
            with pytest.raises(httpx.TransportError):
                _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})
        assert real_compass.listening() is (mode != "refuse")
        # Nothing reached Director.
        assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=runtime_id) == 0
    finally:
        real_compass.clear_down()
    assert real_compass.listening()
    back = _register(http, real_compass, token, account, {"kyma_runtime_id": runtime_id})
    assert back.status_code == 200, back.text
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=runtime_id) == 1


def test_the_admin_api_takes_compass_down_and_back(
    real_compass: RealCompass, http: httpx.Client
) -> None:
    admin = f"{real_compass.gateway_url}/_gateway"
    try:
        assert http.put(f"{admin}/down", json={"mode": "refuse"}).status_code == 400
        assert http.put(f"{admin}/down", json={"mode": "503"}).status_code == 200
        assert http.post(real_compass.token_url).status_code == 503
        assert http.get(f"{admin}/calls").status_code == 200  # the admin API stays up
    finally:
        assert http.delete(f"{admin}/down").status_code == 204
    assert http.post(real_compass.token_url).status_code == 401  # no credentials: up again


def _client_tls(cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """TLS for a client of the certificate-secured side: its server certificate is from a
    throwaway CA (compass-runtime-agent skips the check too), ours is the Connector's."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def test_the_certificate_secured_side_serves_the_runtime_itself(
    real_compass: RealCompass, http: httpx.Client, token: str, tmp_path: Path
) -> None:
    base = real_compass.start_certificate_secured()
    runtime_id, one_time, account = _one_time_token(http, real_compass, token)
    issued = exchange_token(http, f"{real_compass.gateway_url}/connector/graphql", one_time)
    assert issued.director_url == f"{base}/director/graphql"
    assert issued.secured_connector_url == f"{base}/connector/graphql"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(issued.client_pem)
    key.write_bytes(issued.key_pem)
    calls = real_compass.calls()
    with httpx.Client(timeout=30, verify=_client_tls(cert, key)) as mtls:
        # What compass-runtime-agent asks Director (its Tenant header is not what counts).
        query = (
            f'query {{ runtime(id: "{runtime_id}") {{ labels }} '
            f'applicationsForRuntime(runtimeID: "{runtime_id}") {{ data {{ id }} totalCount }} }}'
        )
        found = mtls.post(
            f"{base}/director/graphql", headers={"Tenant": "x"}, json={"query": query}
        )
        assert found.status_code == 200, found.text
        data = found.json()["data"]
        assert data["runtime"]["labels"]["runtimeType"] == "kyma"
        assert data["applicationsForRuntime"] == {"data": [], "totalCount": 0}
        label = (
            f'mutation {{ setRuntimeLabel(runtimeID: "{runtime_id}", key: "runtime_consoleUrl", '
            f'value: "https://console.example") {{ key value }} }}'
        )
        assert "errors" not in mtls.post(f"{base}/director/graphql", json={"query": label}).json()
        stored = real_compass.runtimes(label_key="runtime_consoleUrl")
        assert runtime_id in [r["id"] for r in stored]
        # Connector by certificate: the connection check, with a fresh CSR token.
        config = mtls.post(
            f"{base}/connector/graphql",
            json={"query": "{ configuration { token { token } } }"},
        ).json()["data"]["configuration"]
        assert config["token"]["token"]
        # Unregistered, the runtime's certificate opens nothing at Director.
        gone = _graphql(
            http, real_compass, token, account, documents.UNREGISTER_RUNTIME, {"id": runtime_id}
        )
        assert gone.status_code == 200, gone.text
        refused = mtls.post(f"{base}/director/graphql", json={"query": query})
        assert refused.status_code == 401
    # Not counted among the callers' calls (the broker's).
    assert real_compass.calls().get("runtime", 0) == calls.get("runtime", 0)
    # Only the gateway's Connector's certificates pass the handshake.
    with (
        httpx.Client(timeout=10, verify=_client_tls()) as anonymous,
        pytest.raises(httpx.TransportError),
    ):
        anonymous.post(f"{base}/director/graphql", json={"query": query})


def _register_until_it_works(
    http: httpx.Client, stack: RealCompass, token: str, account: str, runtime_id: str
) -> httpx.Response:
    """Director reconnects to its database on its own; until then a call may fail."""

    def attempt() -> httpx.Response | None:
        answer = _register(http, stack, token, account, {"kyma_runtime_id": runtime_id})
        ok = answer.status_code == 200 and "errors" not in answer.json()
        return answer if ok else None

    answer: httpx.Response = wait_for(attempt, timeout=20, what="Director registering again")
    return answer


def test_the_database_stopped_and_started_again_under_a_running_director(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    database = real_compass.database
    assert database is not None
    port, director_pid = database.port, real_compass.pids()["director"]
    down_id, back_id = _unique("rt"), _unique("rt")

    with real_compass.database_stopped():
        assert not database.running
        assert real_compass.running  # stopped on purpose: the stack counts as up
        down = _register(http, real_compass, token, account, {"kyma_runtime_id": down_id})
        # Director answers, and what it answers is an error, not a registration.
        assert down.status_code != 200 or down.json().get("errors"), down.text
        assert _alive(director_pid)

    assert database.running
    assert database.port == port  # the same address: Director's configuration still holds
    _register_until_it_works(http, real_compass, token, account, back_id)
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=down_id) == 0
    assert real_compass.runtime_count(label_key="kyma_runtime_id", label_value=back_id) == 1
    assert real_compass.pids()["director"] == director_pid  # Director was never restarted


def _cutter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "real-director-session-cutter"]


def test_cutting_directors_sessions_ends_them_and_spares_its_own(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    # A call first, so Director's pool holds a connection to cut.
    _register_until_it_works(http, real_compass, token, account, _unique("rt"))

    cutter = real_compass.cut_sessions(every=0.2, for_seconds=2)
    assert cutter.wait(timeout=30)

    assert cutter.terminated >= 1  # at least Director's idle connection
    # Its own session was never ended: each round's psql finished without an error.
    assert cutter.errors == []
    assert cutter.rounds >= 5
    assert _cutter_threads() == []
    # The harness's queries were spared, and Director reconnects after the cuts.
    answer = _register_until_it_works(http, real_compass, token, account, _unique("rt"))
    assert answer.status_code == 200


def test_cutting_sessions_stops_early_and_leaves_no_thread(real_compass: RealCompass) -> None:
    cutter = real_compass.cut_sessions(every=0.5, for_seconds=600)
    assert cutter.running
    cutter.stop(timeout=10)
    assert not cutter.running
    assert _cutter_threads() == []


def test_refused_credentials_revoke_every_token_until_accepted_again(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)

    def new_token() -> httpx.Response:
        return http.post(
            real_compass.token_url,
            auth=(real_compass.client_id, real_compass.client_secret),
            data={"grant_type": "client_credentials"},
        )

    real_compass.refuse_credentials()
    try:
        refused = new_token()
        revoked = _register(http, real_compass, token, account, {})
    finally:
        real_compass.accept_credentials()

    assert refused.status_code == 401
    assert refused.json()["error"] == "invalid_client"
    assert revoked.status_code == 401  # Oathkeeper's answer to a bearer it does not know
    assert revoked.json()["error"]["status"] == "Unauthorized"
    fresh = new_token()
    assert fresh.status_code == 200, fresh.text
    works = _register(http, real_compass, fresh.json()["access_token"], account, {})
    assert works.status_code == 200, works.text
    assert "errors" not in works.json()
    # A token revoked stays revoked.
    assert _register(http, real_compass, token, account, {}).status_code == 401


def test_the_admin_api_refuses_and_accepts_credentials(
    real_compass: RealCompass, http: httpx.Client
) -> None:
    admin = f"{real_compass.gateway_url}/_gateway/credentials"
    auth = (real_compass.client_id, real_compass.client_secret)
    form = {"grant_type": "client_credentials"}
    try:
        assert http.put(admin, json={"status": 200}).status_code == 400  # not a refusal
        assert http.put(admin, json={"status": 400}).status_code == 200
        assert http.post(real_compass.token_url, auth=auth, data=form).status_code == 400
    finally:
        assert http.delete(admin).status_code == 204
    assert http.post(real_compass.token_url, auth=auth, data=form).status_code == 200


def test_latency_delays_each_graphql_call_until_cleared(
    real_compass: RealCompass, http: httpx.Client, token: str
) -> None:
    account = _unique("ga")
    real_compass.add_global_account(account)
    with pytest.raises(ValueError, match="min <= max"):
        real_compass.set_latency(0.5, 0.1)
    real_compass.set_latency(0.4, 0.5)
    try:
        began = time.monotonic()
        slow = _register(http, real_compass, token, account, {})
        took = time.monotonic() - began
    finally:
        real_compass.set_latency(None)

    assert slow.status_code == 200, slow.text
    assert took >= 0.4  # at least the range's low end
    assert real_compass.gateway.latency is None
    admin = f"{real_compass.gateway_url}/_gateway/latency"
    try:
        assert http.put(admin, json={"min": 0.2, "max": 0.1}).status_code == 400
        assert http.put(admin, json={"min": 0.1, "max": 0.2}).json() == {"latency": [0.1, 0.2]}
    finally:
        assert http.delete(admin).status_code == 204
    assert real_compass.gateway.latency is None
