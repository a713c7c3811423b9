"""Connection reports against real API servers, the Compass simulator and real broker processes:
recorded on the mapping (status, condition, printer columns), written only on change, limited
per runtime, never lost between two replicas, no Director call; stale and stuck runtimes get a
condition and a Warning Event from the leader."""

from __future__ import annotations

import ssl
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import (
    GROUP,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
SHA = "0123456789abcdef" * 4
FAST = {"BROKER_REPORT_MIN_INTERVAL_SECONDS": "0.001"}


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def body(state: str = "Connected", **extra: Any) -> dict[str, Any]:
    return {"connectionState": state, "observedAt": now_text(), **extra}


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


def status(rt: Runtime) -> dict[str, Any]:
    return dict((rt.mapping() or {}).get("status") or {})


def condition(rt: Runtime, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(rt).get("conditions") or [] if c["type"] == type_), None)


def total_attempts(sim: Any) -> int:
    return sum(int(c.attempts) for c in sim.counters().values())


def mapping_table(kcp: TestCluster, namespace: str) -> dict[str, Any]:
    """`kubectl get compassmanagermappings` as the API server renders it (a meta.k8s.io Table),
    asked for as kubectl does, as the admin."""
    pki = kcp.workdir / "pki"
    tls = ssl.create_default_context(cafile=str(kcp.ca_file))
    tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    response = httpx.get(
        f"{kcp.server}/apis/{GROUP}/v1beta1/namespaces/{namespace}/compassmanagermappings",
        headers={"Accept": TABLE},
        verify=tls,
        timeout=30,
    )
    response.raise_for_status()
    table: dict[str, Any] = response.json()
    assert table["kind"] == "Table"
    return table


def row_of(table: dict[str, Any], name: str) -> dict[str, Any]:
    columns = [c["name"] for c in table["columnDefinitions"]]
    [row] = [r for r in table["rows"] if r["object"]["metadata"]["name"] == name]
    return dict(zip(columns, row["cells"], strict=True))


def events(rt: Runtime, reason: str) -> list[Any]:
    return [
        e
        for e in rt.kcp.core.list_namespaced_event(rt.namespace).items
        if e.reason == reason and e.involved_object.name == rt.kyma_name
    ]


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


def test_a_report_is_recorded_with_its_condition_and_shown_by_kubectl_get(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(**FAST)
    issued = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert issued.status_code == 201, issued.text
    # The token's status is written right after the answer; the reports below come after it.
    wait_for(lambda: condition(rt_a, "TokenIssued"), what="TokenIssued after the token")
    compass_id = issued.json()["compassRuntimeID"]
    director_calls = total_attempts(sim)

    sent = body(certificateNotAfter="2027-06-01T12:00:00+02:00", tokenSha256=SHA)
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=sent)
    assert r.status_code == 202, r.text
    assert r.json() == {"nextReportAfterSeconds": 300}
    connection = status(rt_a)["connection"]
    assert connection["state"] == "Connected"
    assert connection["connected"] is True
    assert connection["certificateNotAfter"] == "2027-06-01T10:00:00Z"
    assert connection["tokenSha256"] == SHA
    assert connection["lastReportAt"]
    assert "lastError" not in connection
    connected = condition(rt_a, "Connected")
    assert connected is not None
    assert (connected["status"], connected["reason"]) == ("True", "Connected")
    # Reports cost no Director call.
    assert total_attempts(sim) == director_calls

    table = mapping_table(rt_a.kcp, rt_a.namespace)
    columns = [c["name"] for c in table["columnDefinitions"] if c.get("priority", 0) == 0]
    assert columns[:1] == ["Name"]
    assert columns[1:] == [
        "Runtime",
        "Compass ID",
        "State",
        "Connected",
        "Revoked",
        "Enrolment Pending",
        "Last Report",
        "Age",
    ]
    row = row_of(table, rt_a.kyma_name)
    assert row["Runtime"] == rt_a.runtime_id
    assert row["Compass ID"] == compass_id
    assert (row["State"], row["Connected"]) == ("Connected", "True")
    assert row["Last Report"]  # a date, rendered as an age by kubectl

    # Connected → ConnectionFailed: written at once, with the error as the message.
    failed = body("ConnectionFailed", lastError="token already used", tokenSha256=SHA)
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=failed)
    assert r.status_code == 202, r.text
    connection = status(rt_a)["connection"]
    assert (connection["state"], connection["connected"]) == ("ConnectionFailed", False)
    assert connection["lastError"] == "token already used"
    connected = condition(rt_a, "Connected")
    assert connected is not None
    assert (connected["status"], connected["reason"], connected["message"]) == (
        "False",
        "ConnectionFailed",
        "token already used",
    )
    row = row_of(mapping_table(rt_a.kcp, rt_a.namespace), rt_a.kyma_name)
    assert (row["State"], row["Connected"]) == ("ConnectionFailed", "False")
    # Other conditions stay as they were.
    assert condition(rt_a, "TokenIssued") is not None
    # A Warning Event on the Kyma says it, with the runtime's error.
    wait_for(lambda: events(rt_a, "RuntimeConnectionFailed"), what="RuntimeConnectionFailed")
    [event] = events(rt_a, "RuntimeConnectionFailed")
    assert (event.type, event.involved_object.kind) == ("Warning", "Kyma")
    assert event.message == "the runtime reports ConnectionFailed: token already used"

    # The same report again: nothing written (the mapping's resourceVersion stays).
    version = (rt_a.mapping() or {})["metadata"]["resourceVersion"]
    for _ in range(3):
        r = broker.report_connection(
            rt_a.runtime_id, rt_a.token(), body=failed | {"observedAt": now_text()}
        )
        assert r.status_code == 202, r.text
    assert (rt_a.mapping() or {})["metadata"]["resourceVersion"] == version
    metrics = broker.metrics()
    assert 'broker_connection_reports_total{outcome="unchanged"} 3.0' in metrics
    assert 'broker_connection_reports_total{outcome="recorded"} 2.0' in metrics
    assert 'broker_runtimes_by_connection_state{state="ConnectionFailed"} 1.0' in metrics
    assert total_attempts(sim) == director_calls


def test_reports_are_limited_per_runtime_and_refused_like_tokens(
    brokers: BrokerFactory,
    rt_a: Runtime,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_b: TestCluster,
    sim: Any,
) -> None:
    broker = brokers()
    rt_b = seed_runtime(control_plane, kcp_ns, runtime_b)
    # A proven runtime without a mapping (never asked for a token): nothing to record on.
    r = broker.report_connection(rt_b.runtime_id, rt_b.token(), body=body("NotFound"))
    assert (r.status_code, problem_type(r)) == (409, "runtime-not-registered")
    assert rt_b.mapping() is None
    # Unproven, or another runtime's proof: refused as for a token.
    r = broker.report_connection(rt_a.runtime_id, "garbage", body=body())
    assert (r.status_code, problem_type(r)) == (401, "identity-not-proven")
    r = broker.report_connection(rt_a.runtime_id, rt_b.token(), body=body())
    assert (r.status_code, problem_type(r)) == (403, "identity-forbidden")
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=body() | {"x": 1})
    assert (r.status_code, problem_type(r)) == (400, "malformed-request")
    assert total_attempts(sim) == 0

    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    first = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=body())
    assert first.status_code == 202, first.text
    flood = [broker.report_connection(rt_a.runtime_id, rt_a.token(), body=body()) for _ in range(5)]
    assert {(r.status_code, problem_type(r)) for r in flood} == {(429, "rate-limited")}
    assert all(int(r.headers["Retry-After"]) >= 1 for r in flood)
    # Unproven callers learn nothing from the limit: still 401.
    r = broker.report_connection(rt_a.runtime_id, "garbage", body=body())
    assert r.status_code == 401
    assert 'broker_connection_reports_total{outcome="rate-limited"} 5.0' in broker.metrics()


def test_two_brokers_receiving_reports_alternately_lose_no_update(
    brokers: BrokerFactory, rt_a: Runtime
) -> None:
    one, two = brokers(**FAST), brokers(**FAST)
    assert one.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    wait_for(lambda: condition(rt_a, "TokenIssued"), what="TokenIssued after the token")
    token = rt_a.token()
    states = ["Connected", "ConnectionFailed", "Synchronized", "SynchronizationFailed"]
    for index in range(16):
        broker = (one, two)[index % 2]
        state = states[index % len(states)]
        sent = body(state, lastError=f"report {index}")
        r = broker.report_connection(rt_a.runtime_id, token, body=sent)
        assert r.status_code == 202, r.text
        # Each answer means "recorded": read straight from the API server, whichever replica.
        connection = status(rt_a)["connection"]
        assert (connection["state"], connection["lastError"]) == (state, f"report {index}")
        connected = condition(rt_a, "Connected")
        assert connected is not None
        assert connected["message"] == f"report {index}"
    # At once: two reports, one to each replica, racing for the same mapping version. Whatever
    # order they land in, the newer observation is what stays: the older one either conflicts
    # and is judged again on top of the newer, or is overwritten by it.
    with ThreadPoolExecutor(2) as pool:
        for pair in range(10):
            older = body(states[pair % len(states)], lastError=f"older {pair}")
            newer = body(states[(pair + 1) % len(states)], lastError=f"newer {pair}")
            answers = list(
                pool.map(
                    lambda sent: sent[0].report_connection(rt_a.runtime_id, token, body=sent[1]),
                    [(one, older), (two, newer)] if pair % 2 else [(two, older), (one, newer)],
                )
            )
            assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
            connection = status(rt_a)["connection"]
            assert connection["lastError"] == f"newer {pair}"
            connected = condition(rt_a, "Connected")
            assert connected is not None
            assert connected["message"] == f"newer {pair}"
    # The token's conditions, written by another code path, survived every report.
    assert condition(rt_a, "TokenIssued") is not None
    assert condition(rt_a, "Registered") is not None


def test_the_leader_flags_stale_reports_and_runtimes_not_connected_after_a_token(
    brokers: BrokerFactory,
    rt_a: Runtime,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_b: TestCluster,
) -> None:
    broker = brokers(
        **FAST,
        BROKER_REPORT_INTERVAL_SECONDS="1",
        BROKER_REPORT_REFRESH_SECONDS="1",
        BROKER_REPORT_STALE_SECONDS="4",
        BROKER_CONNECT_DEADLINE_SECONDS="3",
        BROKER_CONNECTION_CHECK_INTERVAL_SECONDS="0.5",
    )
    rt_b = seed_runtime(control_plane, kcp_ns, runtime_b)
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    assert broker.request_token(rt_b.runtime_id, rt_b.token()).status_code == 201

    # A reports Connected at once; B never reports: after the deadline B is flagged, A is not.
    assert broker.report_connection(rt_a.runtime_id, rt_a.token(), body=body()).status_code == 202

    def flagged(rt: Runtime) -> bool:
        c = condition(rt, "Connected")
        return c is not None and c["reason"] == "NotConnectedAfterToken"

    wait_for(lambda: flagged(rt_b), timeout=30, what="B flagged NotConnectedAfterToken")
    stuck = condition(rt_b, "Connected")
    assert stuck is not None
    assert stuck["status"] == "False"
    wait_for(lambda: events(rt_b, "RuntimeNotConnected"), what="the RuntimeNotConnected Event")
    assert events(rt_b, "RuntimeNotConnected")[0].type == "Warning"
    assert not flagged(rt_a)

    # B connects at last: the condition flips on the report itself.
    assert broker.report_connection(rt_b.runtime_id, rt_b.token(), body=body()).status_code == 202
    connected = condition(rt_b, "Connected")
    assert connected is not None
    assert (connected["status"], connected["reason"]) == ("True", "Connected")

    # A stops reporting: its reports go stale, with one Warning Event.
    def stale(rt: Runtime) -> bool:
        c = condition(rt, "ReportsStale")
        return c is not None and c["status"] == "True"

    wait_for(lambda: stale(rt_a), timeout=30, what="A's ReportsStale")
    wait_for(
        lambda: events(rt_a, "ConnectionReportsStale"), what="the ConnectionReportsStale Event"
    )
    wait_for(
        lambda: 'broker_runtimes_attention{reason="reports-stale"} 0.0' not in broker.metrics(),
        what="the stale runtime counted",
    )
    # Reporting again clears it.
    assert broker.report_connection(rt_a.runtime_id, rt_a.token(), body=body()).status_code == 202
    cleared = condition(rt_a, "ReportsStale")
    assert cleared is not None
    assert (cleared["status"], cleared["reason"]) == ("False", "ReportsReceived")


def test_fleet_metrics_count_runtimes_without_reports_as_unknown(
    brokers: BrokerFactory,
    rt_a: Runtime,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_b: TestCluster,
) -> None:
    broker = brokers(**FAST)
    rt_b = seed_runtime(control_plane, kcp_ns, runtime_b)
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    assert broker.request_token(rt_b.runtime_id, rt_b.token()).status_code == 201
    assert (
        broker.report_connection(
            rt_a.runtime_id, rt_a.token(), body=body("Synchronized")
        ).status_code
        == 202
    )

    def counted() -> bool:
        text = broker.metrics()
        return (
            'broker_runtimes_by_connection_state{state="Synchronized"} 1.0' in text
            and 'broker_runtimes_by_connection_state{state="unknown"} 1.0' in text
        )

    wait_for(counted, what="the fleet gauges from the mapping view")
    assert "broker_connection_report_oldest_age_seconds" in broker.metrics()
