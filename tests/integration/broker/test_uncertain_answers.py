"""Exactly-once when Director's answer does not tell what it wrote: the broker process against
real API servers and the Compass simulator's database faults (docs/compass-simulator.md):

- `commit_then_error`: a writing call took effect, and Director answers code 10 ("while
  committing transaction: driver: bad connection") instead of the data;
- `field_error_after_commit`: registerRuntime took effect, the answer carries the new
  runtime's id with `labels` null and a code-10 error at `[registerRuntime, labels]`;
- `database_down`: every Director call fails without effect (codes 10 and 26, HTTP 200).

Each test drives token requests (or a Kyma change) until the broker is done, then checks the
outcome where it lands: one Director runtime per Kyma (by the `kyma_runtime_id` label), the
mapping recording that runtime, the Kyma's deletion and label changes carried out, and the
broker's answers on the way (503 `compass-unavailable` with Retry-After, never 502: Director's
database failing is an outage, not a refusal). Calls are counted from the simulator's request
log: after an uncertain answer to registerRuntime the broker looks the runtime up once, and
registers only when the look-up finds nothing.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from devenv.clusters import TestCluster
from devenv.compass_sim.errors import ErrorCode
from devenv.compass_sim.faults import InjectedError
from devenv.compass_sim.oauth import hash_token
from devenv.compass_sim.recorder import Outcome
from devenv.compass_sim.store import RuntimeRecord, TokenKind
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime, wait_for
from tests.integration.broker.test_broker import attempts, problem_type

RUNTIME_ID_LABEL = "kyma_runtime_id"
COMPASS_ID = "kyma-project.io/compass-runtime-id"
PLAN_NAME = "kyma-project.io/broker-plan-name"
# A broker that retries soon: the breaker's open period is short, the per-runtime rate limit
# wide enough for the retries of one test.
QUICK = {
    "BROKER_BREAKER_OPEN_SECONDS": "1",
    "BROKER_RATE_LIMIT_BURST": "50",
}


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


def token_in_the_end(
    broker: Any, rt: Runtime, *, timeout: float = 40.0
) -> tuple[httpx.Response, list[httpx.Response]]:
    """Asks for the runtime's token until one is issued: that answer and the ones before it."""
    refused: list[httpx.Response] = []

    def ask() -> httpx.Response | None:
        response = broker.request_token(rt.runtime_id, rt.token())
        if response.status_code == 201:
            return response
        refused.append(response)
        return None

    issued: httpx.Response = wait_for(
        ask, timeout=timeout, interval=0.5, what=f"a token for {rt.runtime_id}"
    )
    return issued, refused


def assert_unavailable(responses: list[httpx.Response]) -> None:
    """Every answer is Compass being unavailable, with a time to come back: none is a 502."""
    for response in responses:
        assert (response.status_code, problem_type(response)) == (503, "compass-unavailable"), (
            response.status_code,
            response.text,
        )
        assert int(response.headers["Retry-After"]) >= 1


def director_runtimes_of(sim: Any, rt: Runtime) -> list[RuntimeRecord]:
    return [r for r in sim.runtimes() if r.labels.get(RUNTIME_ID_LABEL) == rt.runtime_id]


def the_one_runtime(sim: Any, rt: Runtime) -> RuntimeRecord:
    """The only Director runtime of this Kyma, which its mapping records."""
    runtimes = director_runtimes_of(sim, rt)
    assert len(runtimes) == 1, [r.id for r in runtimes]
    mapping = rt.mapping()
    assert mapping is not None
    assert mapping["metadata"]["labels"][COMPASS_ID] == runtimes[0].id
    return runtimes[0]


@pytest.fixture
def label_queries(sim: Any) -> list[tuple[str, ...]]:
    """The label keys each `runtimes` query filtered by, in the order Director ran them (the
    order of the request log: the simulator records a call as soon as it ran it)."""
    seen: list[tuple[str, ...]] = []
    run = sim.store.list_runtimes

    def recording(tenant: str, filters: list[Any], *, offset: int, limit: int) -> Any:
        seen.append(tuple(f.key for f in filters))
        return run(tenant, filters, offset=offset, limit=limit)

    sim.store.list_runtimes = recording
    return seen


def lookups_after_first_registration(sim: Any, label_queries: list[tuple[str, ...]]) -> int:
    """Look-ups by the runtime's label after the first registerRuntime reached Director (those
    before it, of a Kyma older than the broker, are the ordinary path). A look-up that finds
    nothing by our label asks by compass-manager's `gardenerClusterName` next: part of it."""
    log = sim.request_log()
    first = next(r.seq for r in log if r.operation == "registerRuntime")
    queries = [r for r in log if r.operation == "runtimes"]
    assert len(queries) == len(label_queries)
    after = [keys for r, keys in zip(queries, label_queries, strict=True) if r.seq > first]
    ours = [keys for keys in after if keys == (RUNTIME_ID_LABEL,)]
    legacy = [keys for keys in after if keys == ("gardenerClusterName",)]
    assert len(ours) + len(legacy) == len(after), after
    assert len(legacy) <= len(ours), after
    return len(ours)


def uncertain_registrations(sim: Any) -> int:
    """registerRuntime answers that do not prove nothing was written: code 10 at the top."""
    return sum(1 for r in sim.request_log(operation="registerRuntime") if 10 in r.error_codes)


def outcomes(sim: Any, operation: str) -> list[Outcome]:
    return [r.outcome for r in sim.request_log(operation=operation)]


def director_label(sim: Any, rt: Runtime, key: str) -> Any:
    runtimes = director_runtimes_of(sim, rt)
    return runtimes[0].labels.get(key) if len(runtimes) == 1 else None


def recorded_label(rt: Runtime, key: str) -> Any:
    mapping = rt.mapping() or {}
    return ((mapping.get("status") or {}).get("directorLabels") or {}).get(key)


# --- registerRuntime ------------------------------------------------------------------------


def test_registration_committed_then_answered_code_10_is_found_not_registered_again(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any, label_queries: list[tuple[str, ...]]
) -> None:
    broker = brokers(**QUICK)
    sim.update_faults(commit_then_error={"registerRuntime": 1})

    issued, refused = token_in_the_end(broker, rt_a)

    assert outcomes(sim, "registerRuntime") == [Outcome.ERROR_AFTER_COMMIT]  # the fault fired
    assert refused, "the answer to the failed commit was a token"
    assert_unavailable(refused)
    runtime = the_one_runtime(sim, rt_a)
    assert issued.json()["compassRuntimeID"] == runtime.id
    assert attempts(sim, "registerRuntime") == 1  # found by its label, not registered again
    assert lookups_after_first_registration(sim, label_queries) <= uncertain_registrations(sim)
    assert uncertain_registrations(sim) == 1


def test_registration_whose_labels_field_failed_uses_the_answered_id(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any, label_queries: list[tuple[str, ...]]
) -> None:
    broker = brokers(**QUICK)
    sim.update_faults(field_error_after_commit={"registerRuntime": 1})

    issued, refused = token_in_the_end(broker, rt_a)

    assert outcomes(sim, "registerRuntime") == [Outcome.ERROR_AFTER_COMMIT]  # the fault fired
    runtime = the_one_runtime(sim, rt_a)
    assert issued.json()["compassRuntimeID"] == runtime.id
    # The answer named the runtime it registered: nothing to look up, nothing to retry.
    assert [r.status_code for r in refused] == []
    assert attempts(sim, "registerRuntime") == 1
    assert lookups_after_first_registration(sim, label_queries) == 0


def test_uncertain_answers_that_wrote_nothing_cost_one_look_up_each(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any, label_queries: list[tuple[str, ...]]
) -> None:
    # Code 10 with nothing written (the database failed before the commit): the broker cannot
    # tell it from a failed commit, so it looks, finds nothing and registers; once.
    broker = brokers(**QUICK)
    sim.update_faults(
        errors=(
            InjectedError(
                operation="registerRuntime",
                error_code=ErrorCode.INTERNAL_ERROR,
                message=f"Internal Server Error [errorID={uuid.uuid4()}]",
                remaining=2,
            ),
        )
    )

    issued, refused = token_in_the_end(broker, rt_a)

    assert outcomes(sim, "registerRuntime") == [
        Outcome.INJECTED_ERROR,
        Outcome.INJECTED_ERROR,
        Outcome.OK,
    ]
    assert_unavailable(refused)
    runtime = the_one_runtime(sim, rt_a)
    assert issued.json()["compassRuntimeID"] == runtime.id
    assert lookups_after_first_registration(sim, label_queries) <= uncertain_registrations(sim)
    assert uncertain_registrations(sim) == 2


# --- requestOneTimeTokenForRuntime ---------------------------------------------------------


def test_token_committed_then_answered_code_10_is_followed_by_a_token_that_works(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(**QUICK)
    sim.update_faults(commit_then_error={"requestOneTimeTokenForRuntime": 1})

    issued, refused = token_in_the_end(broker, rt_a)

    assert outcomes(sim, "requestOneTimeTokenForRuntime")[0] is Outcome.ERROR_AFTER_COMMIT
    assert refused, "the answer to the failed commit was a token"
    assert_unavailable(refused)
    runtime = the_one_runtime(sim, rt_a)
    assert issued.json()["compassRuntimeID"] == runtime.id
    assert attempts(sim, "registerRuntime") == 1
    # Director holds the token it wrote but never handed over, and the one the agent got.
    tokens = [t for t in sim.connector_tokens(runtime.id) if t.kind is TokenKind.ONE_TIME]
    assert len(tokens) == 2
    assert hash_token(issued.json()["token"]) in {t.token_hash for t in tokens}


# --- unregisterRuntime ------------------------------------------------------------------------


def test_unregistration_committed_then_answered_code_10_removes_the_mapping(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(**QUICK)
    token_in_the_end(broker, rt_a)
    runtime = the_one_runtime(sim, rt_a)
    sim.update_faults(commit_then_error={"unregisterRuntime": 1})

    rt_a.delete_kyma()

    wait_for(
        lambda: rt_a.mapping() is None,
        timeout=40,
        interval=0.5,
        what="the mapping to be removed after the unregistration",
    )
    assert outcomes(sim, "unregisterRuntime")[0] is Outcome.ERROR_AFTER_COMMIT  # it fired
    assert sim.runtime(runtime.id) is None
    assert director_runtimes_of(sim, rt_a) == []
    assert attempts(sim, "registerRuntime") == 1


# --- setRuntimeLabel --------------------------------------------------------------------------


def test_label_committed_then_answered_code_10_ends_synced_and_later_changes_follow(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(**QUICK)
    token_in_the_end(broker, rt_a)
    runtime = the_one_runtime(sim, rt_a)
    # The labels sent with registerRuntime are on record before a change is compared with them.
    wait_for(lambda: recorded_label(rt_a, "broker_plan_name"), what="directorLabels on record")
    sim.update_faults(commit_then_error={"setRuntimeLabel": 1})

    rt_a.patch_kyma({"metadata": {"labels": {PLAN_NAME: "plan-after-failed-commit"}}})

    wait_for(
        lambda: (
            director_label(sim, rt_a, "broker_plan_name") == "plan-after-failed-commit"
            and recorded_label(rt_a, "broker_plan_name") == "plan-after-failed-commit"
        ),
        timeout=40,
        interval=0.5,
        what="the label in Director and on record",
    )
    assert outcomes(sim, "setRuntimeLabel")[0] is Outcome.ERROR_AFTER_COMMIT  # it fired

    # The record is right, not stuck: the next change is written too.
    rt_a.patch_kyma({"metadata": {"labels": {PLAN_NAME: "plan-later"}}})
    wait_for(
        lambda: director_label(sim, rt_a, "broker_plan_name") == "plan-later",
        timeout=40,
        interval=0.5,
        what="the next label change in Director",
    )
    assert the_one_runtime(sim, rt_a).id == runtime.id
    assert attempts(sim, "registerRuntime") == 1


# --- Director's database gone -----------------------------------------------------------------


def test_database_down_answers_503_and_every_runtime_gets_its_token_after(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    runtime_b: TestCluster,
    sim: Any,
) -> None:
    broker = brokers(**QUICK, BROKER_BREAKER_FAILURE_THRESHOLD="10")
    # Kymas created after the broker's mapping watch listed (clock skew allowance: 2 s) are
    # certainly new: their first attempt registers at once, so registerRuntime meets the
    # database's answers too, not only the look-ups.
    time.sleep(3)
    runtimes = [
        seed_runtime(control_plane, kcp_ns, runtime_a),
        seed_runtime(control_plane, kcp_ns, runtime_a),
        seed_runtime(control_plane, kcp_ns, runtime_b),
    ]
    sim.update_faults(database_down=True)

    answers = []
    for _ in range(3):
        for rt in runtimes:
            answers.append(broker.request_token(rt.runtime_id, rt.token()))
        time.sleep(0.5)

    assert_unavailable(answers)
    assert sim.runtimes() == []  # nothing was written
    register_codes = {
        c for r in sim.request_log(operation="registerRuntime") for c in r.error_codes
    }
    assert register_codes == {10, 26}  # the mix reached the broker: code 26 is among it

    sim.update_faults(database_down=False)
    issued = {rt.runtime_id: token_in_the_end(broker, rt)[0] for rt in runtimes}

    for rt in runtimes:
        runtime = the_one_runtime(sim, rt)
        assert issued[rt.runtime_id].json()["compassRuntimeID"] == runtime.id
    assert len(sim.runtimes()) == len(runtimes)
    assert sim.counter("registerRuntime").successes == len(runtimes)
