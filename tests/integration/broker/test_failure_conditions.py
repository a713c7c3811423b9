"""Failures leave a trace on the mapping (a condition) and in Events (a Warning), once.

Real API servers and the Compass simulator; the broker runs as its own process. Each test checks
the condition fields (cert-manager style), that a repeated failure writes nothing and emits no
second Event, and that recovery flips the condition or finishes the job.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from devenv.clusters import TestCluster
from devenv.compass_sim.errors import ErrorCode
from devenv.compass_sim.faults import DownMode, Faults, InjectedError
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime, wait_for

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
FINALIZER = "kyma-project.io/cm-protection"


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


def condition(rt: Runtime, type_: str) -> dict[str, Any] | None:
    mapping = rt.mapping()
    for cond in ((mapping or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def warnings(rt: Runtime, reason: str) -> list[Any]:
    events = rt.kcp.core.list_namespaced_event(rt.namespace).items
    return [e for e in events if e.reason == reason and e.type == "Warning"]


def seconds_ago(stamp: str) -> float:
    return time.time() - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def problem(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, str(response.json()["type"]).removeprefix(PROBLEM)


def test_registration_and_token_failures_set_conditions_and_one_warning(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers()
    # Director refuses the registration for good (invalid data): 502, condition, one Warning.
    sim.set_faults(
        Faults(
            errors=(InjectedError(operation="registerRuntime", error_code=ErrorCode.INVALID_DATA),)
        )
    )
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert problem(r) == (502, "compass-rejected"), r.text
    broker.writes_settled()  # the answer did not wait for the condition
    registered = condition(rt_a, "Registered")
    assert registered is not None
    assert (registered["status"], registered["reason"]) == ("False", "CompassRejected")
    assert registered["message"].startswith("Compass rejected the request")
    mapping = rt_a.mapping()
    assert mapping is not None
    assert registered["observedGeneration"] == mapping["metadata"]["generation"]
    assert seconds_ago(registered["lastTransitionTime"]) < 120  # wall time, not a monotonic one
    assert len(warnings(rt_a, "RegistrationFailed")) == 1

    # The same failure again: no write to the mapping, no second Event.
    version = mapping["metadata"]["resourceVersion"]
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert problem(r) == (502, "compass-rejected")
    broker.writes_settled()
    assert rt_a.mapping()["metadata"]["resourceVersion"] == version  # type: ignore[index]
    assert len(warnings(rt_a, "RegistrationFailed")) == 1

    # Director accepts again: the condition flips to True and its transition time moves.
    sim.clear_faults()
    time.sleep(1.1)  # transition times have whole seconds
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert r.status_code == 201, r.text
    # The status is written right after the answer (the agent does not wait for it).
    now_registered = wait_for(
        lambda: (c := condition(rt_a, "Registered")) and c["status"] == "True" and c,
        what="Registered=True after the token",
    )
    assert now_registered["lastTransitionTime"] != registered["lastTransitionTime"]
    status = rt_a.mapping()["status"]  # type: ignore[index]
    assert seconds_ago(status["lastTokenIssuedAt"]) < 120

    # Director down when the token is requested: TokenIssued=False, one Warning, 503.
    sim.set_faults(Faults(down=DownMode.UNAVAILABLE))
    for _ in range(3):
        r = broker.request_token(rt_a.runtime_id, rt_a.token())
        assert problem(r) == (503, "compass-unavailable"), r.text
        assert int(r.headers["Retry-After"]) >= 1
    broker.writes_settled()
    token_issued = condition(rt_a, "TokenIssued")
    assert token_issued is not None
    assert (token_issued["status"], token_issued["reason"]) == ("False", "CompassUnavailable")
    assert len(warnings(rt_a, "TokenRequestFailed")) == 1
    assert condition(rt_a, "Registered")["status"] == "True"  # type: ignore[index]


def test_director_down_while_kyma_deleted_keeps_mapping_until_unregistered(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(BROKER_BREAKER_OPEN_SECONDS="1", BROKER_BREAKER_FAILURE_THRESHOLD="2")
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    # The token's status is written after the answer; once Director fails it could wait up to
    # the deferral's limit and land between the reads below, which must see retries alone.
    broker.writes_settled()
    [runtime] = sim.runtimes(rt_a.tenant)
    sim.set_faults(Faults(down=DownMode.UNAVAILABLE))
    rt_a.delete_kyma()

    cond = wait_for(
        lambda: (c := condition(rt_a, "Unregistered")) is not None and c,
        timeout=40,
        what="the Unregistered failure condition",
    )
    assert (cond["status"], cond["reason"]) == ("False", "CompassUnavailable")
    assert "unregister (kyma-deleted)" in cond["message"]
    mapping = rt_a.mapping()
    assert mapping is not None
    assert FINALIZER in mapping["metadata"]["finalizers"]  # kept until Director confirms
    assert cond["observedGeneration"] == mapping["metadata"]["generation"]
    wait_for(lambda: warnings(rt_a, "UnregisterFailed"), timeout=20, what="a Warning Event")

    # Retries go on (sweeps every 2 s, backoff) without rewriting the mapping or more Events.
    broker.writes_settled()
    version = rt_a.mapping()["metadata"]["resourceVersion"]  # type: ignore[index]
    time.sleep(5)
    assert rt_a.mapping()["metadata"]["resourceVersion"] == version  # type: ignore[index]
    assert len(warnings(rt_a, "UnregisterFailed")) == 1
    assert [r.id for r in sim.runtimes(rt_a.tenant)] == [runtime.id]

    sim.clear_faults()
    wait_for(lambda: not list(sim.runtimes(rt_a.tenant)), timeout=60, what="unregistration")
    wait_for(lambda: rt_a.mapping() is None, timeout=30, what="mapping removal")
    events = rt_a.kcp.core.list_namespaced_event(rt_a.namespace).items
    assert "RuntimeUnregistered" in {e.reason for e in events}
