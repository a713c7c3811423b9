"""Compass simulator, faults of Director's database, through HTTP, with the documents the broker
sends (`control_plane_broker.director.documents`):

- `commit_then_error`: each writing call takes effect, and the answer is Director's code 10
  for a failed commit instead of the data;
- `field_error_after_commit`: registerRuntime takes effect, the answer carries the runtime's
  id and name, `labels` null and a code-10 error at `[registerRuntime, labels]`;
- `database_down`: every Director call fails without effect, HTTP 200, codes 10 and 26 in
  turn, while the OAuth endpoint still answers.

The answers are held to what Director's error presenter makes of these errors (kyma-incubator/
compass at a423d60704: pkg/persistence, internal/error_presenter, internal/repo/create.go)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from control_plane_broker.director import documents
from devenv.compass_sim import CompassSimulator, Outcome, SimConfig, TokenKind
from devenv.compass_sim.tenants import internal_tenant_id
from devenv.compass_sim.testing import REGISTER_RUNTIME, DirectorClient, ManualClock, fetch_token

pytestmark = pytest.mark.timeout(60)

TENANT = "ga-db"
CLIENT_ID, CLIENT_SECRET = "db-fault-client", "db-fault-secret"
KYMA_RUNTIME_ID = "3B1F0C8E-5A2D-4E6F-8A9B-0C1D2E3F4A5B"
ERROR_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
INTERNAL = {"error_code": 10, "error": "InternalError"}
COMMIT = "while committing transaction: driver: bad connection"

WRITING_CALLS = (
    "registerRuntime",
    "unregisterRuntime",
    "setRuntimeLabel",
    "requestOneTimeTokenForRuntime",
)


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    with CompassSimulator(config, clock=clock).running() as simulator:
        yield simulator


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


@pytest.fixture
def director(sim: CompassSimulator, http: httpx.Client) -> DirectorClient:
    return DirectorClient(http, sim.director_url, token=sim.issue_access_token(), tenant=TENANT)


def _seed(sim: CompassSimulator) -> str:
    record = sim.seed_runtime(
        tenant=TENANT, name="seeded", labels={"kyma_runtime_id": KYMA_RUNTIME_ID}
    )
    return record.id


def _call(director: DirectorClient, operation: str, runtime_id: str | None) -> httpx.Response:
    """One writing call as the broker sends it."""
    if operation == "registerRuntime":
        given = {"name": "fresh", "labels": {"kyma_runtime_id": KYMA_RUNTIME_ID}}
        return director.post(documents.REGISTER_RUNTIME, {"in": given})
    if operation == "unregisterRuntime":
        return director.post(documents.UNREGISTER_RUNTIME, {"id": runtime_id})
    if operation == "setRuntimeLabel":
        variables = {"runtimeID": runtime_id, "key": "broker_plan_name", "value": "marker"}
        return director.post(documents.SET_RUNTIME_LABEL, variables)
    assert operation == "requestOneTimeTokenForRuntime"
    return director.post(documents.REQUEST_OTT, {"id": runtime_id})


def _snapshot(sim: CompassSimulator) -> Any:
    """What the store holds: runtimes with their labels, and one-time tokens per runtime."""
    runtimes = sorted((r.id, r.name, sorted(r.labels.items())) for r in sim.runtimes())
    tokens = sorted((t.runtime_id, t.kind.value) for t in sim.connector_tokens())
    return runtimes, tokens


def _took_effect(sim: CompassSimulator, operation: str, seeded: str) -> bool:
    if operation == "registerRuntime":
        found = [r for r in sim.runtimes(TENANT) if r.name == "fresh"]
        return len(found) == 1 and found[0].labels["kyma_runtime_id"] == KYMA_RUNTIME_ID
    if operation == "unregisterRuntime":
        return sim.runtime(seeded) is None
    if operation == "setRuntimeLabel":
        record = sim.runtime(seeded)
        return record is not None and record.labels.get("broker_plan_name") == "marker"
    tokens = sim.connector_tokens(seeded)
    return [t.kind for t in tokens] == [TokenKind.ONE_TIME]


# --- fault 1: the commit happened, the answer is an error ---------------------------------------


@pytest.mark.parametrize("operation", WRITING_CALLS)
def test_commit_then_error_takes_effect_and_answers_a_failed_commit(
    sim: CompassSimulator, director: DirectorClient, operation: str
) -> None:
    seeded = _seed(sim)
    sim.update_faults(commit_then_error={operation: 1})
    assert not _took_effect(sim, operation, seeded)

    response = _call(director, operation, seeded)

    assert response.status_code == 200
    body = response.json()
    assert body["data"] is None
    [error] = body["errors"]
    assert set(error) == {"message", "path", "extensions"}
    assert error["path"] == [operation]
    assert error["extensions"] == INTERNAL
    # The one-time token resolver wraps the wrapped commit error once more.
    token = operation == "requestOneTimeTokenForRuntime"
    reason = f"input: {operation} {'while committing transaction: ' if token else ''}{COMMIT}"
    assert re.fullmatch(
        rf"Internal Server Error \[errorID={ERROR_ID}, reason: {re.escape(reason)}\]",
        error["message"],
    ), error["message"]
    assert _took_effect(sim, operation, seeded)
    assert sim.faults().commit_then_error == {}  # a counted fault is used up
    [record] = sim.request_log(operation=operation)
    assert (record.outcome, record.http_status, record.error_codes) == (
        Outcome.ERROR_AFTER_COMMIT,
        200,
        (10,),
    )
    counter = sim.counter(operation)
    assert (counter.attempts, counter.successes, counter.errors) == (1, 0, 1)


def test_commit_then_error_fires_only_on_calls_that_took_effect(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(commit_then_error={"registerRuntime": 2})
    invalid = director.post(documents.REGISTER_RUNTIME, {"in": {"name": "Not Valid"}})
    assert invalid.json()["errors"][0]["extensions"]["error_code"] == 22
    assert sim.faults().commit_then_error["registerRuntime"].remaining == 2
    assert sim.runtimes() == []
    failed = _call(director, "registerRuntime", None)
    assert failed.json()["errors"][0]["extensions"] == INTERNAL
    assert sim.faults().commit_then_error["registerRuntime"].remaining == 1
    assert len(sim.runtimes()) == 1
    # The fault is per operation: another writing call answers as usual.
    [registered] = sim.runtimes()
    other = _call(director, "unregisterRuntime", registered.id).json()
    assert other == {"data": {"unregisterRuntime": {"id": registered.id}}}
    assert sim.faults().commit_then_error["registerRuntime"].remaining == 1


def test_commit_then_error_names_the_response_key_of_an_aliased_field(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(commit_then_error={"registerRuntime": 1})
    [error] = director.post(REGISTER_RUNTIME, {"in": {"name": "aliased"}}).json()["errors"]
    assert error["path"] == ["result"]
    assert f"reason: input: result {COMMIT}]" in error["message"]
    assert [r.name for r in sim.runtimes()] == ["aliased"]


# --- fault 2: the mutation committed, its `labels` field failed ---------------------------------


def test_field_error_after_commit_answers_the_new_runtime_with_labels_null(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    sim.update_faults(field_error_after_commit={"registerRuntime": 1})
    response = _call(director, "registerRuntime", None)

    assert response.status_code == 200
    body = response.json()
    [stored] = sim.runtimes(TENANT)
    assert stored.labels["kyma_runtime_id"] == KYMA_RUNTIME_ID
    assert body["data"] == {"registerRuntime": {"id": stored.id, "name": "fresh", "labels": None}}
    [error] = body["errors"]
    assert set(error) == {"message", "path", "extensions"}
    assert error["path"] == ["registerRuntime", "labels"]
    assert error["extensions"] == INTERNAL
    assert re.fullmatch(
        rf"Internal Server Error \[errorID={ERROR_ID}, "
        rf"reason: input: registerRuntime\.labels {COMMIT}\]",
        error["message"],
    ), error["message"]
    assert sim.faults().field_error_after_commit == {}
    [record] = sim.request_log(operation="registerRuntime")
    assert (record.outcome, record.error_codes) == (Outcome.ERROR_AFTER_COMMIT, (10,))

    # Used up: the next registration answers whole.
    again = _call(director, "registerRuntime", None).json()
    assert "errors" not in again
    assert again["data"]["registerRuntime"]["labels"]["kyma_runtime_id"] == KYMA_RUNTIME_ID


def test_field_error_after_commit_needs_the_labels_field_and_a_call_that_took_effect(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    seeded = _seed(sim)
    sim.update_faults(field_error_after_commit={"registerRuntime": 1, "unregisterRuntime": 1})
    # The broker's unregisterRuntime asks for the id only: no labels resolver, no second
    # transaction, so nothing can fail after the commit.
    gone = _call(director, "unregisterRuntime", seeded).json()
    assert gone == {"data": {"unregisterRuntime": {"id": seeded}}}
    refused = director.post(documents.REGISTER_RUNTIME, {"in": {"name": "Not Valid"}}).json()
    assert refused["errors"][0]["path"] == ["registerRuntime"]
    faults = sim.faults().field_error_after_commit
    assert {name: f.remaining for name, f in faults.items()} == {
        "registerRuntime": 1,
        "unregisterRuntime": 1,
    }


def test_field_error_in_a_runtimes_page_fails_one_item_s_labels(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    first, second = _seed(sim), _seed(sim)
    sim.update_faults(field_error_after_commit={"runtimes": 1})
    body = director.post(documents.RUNTIMES_BY_LABEL, {"first": 10}).json()
    items = body["data"]["runtimes"]["data"]
    assert sorted(item["id"] for item in items) == sorted([first, second])
    assert [item["labels"] is None for item in items] == [True, False]
    [error] = body["errors"]
    assert error["path"] == ["runtimes", "data", 0, "labels"]
    assert f"reason: input: runtimes.data[0].labels {COMMIT}]" in error["message"]


# --- fault 3: the database is gone --------------------------------------------------------------


@pytest.mark.parametrize("operation", WRITING_CALLS)
def test_database_down_fails_every_writing_call_without_effect(
    sim: CompassSimulator, director: DirectorClient, operation: str
) -> None:
    seeded = _seed(sim)
    before = _snapshot(sim)
    sim.update_faults(database_down=True)

    answers = [_call(director, operation, seeded) for _ in range(3)]

    assert _snapshot(sim) == before
    assert {r.status_code for r in answers} == {200}
    errors = []
    for response in answers:
        body = response.json()
        assert body["data"] is None
        [error] = body["errors"]
        assert set(error) == {"message", "path", "extensions"}
        assert error["path"] == [operation]
        errors.append(error)
    internal_id = internal_tenant_id(TENANT)
    # In turn: a typed internal error, the transaction that could not begin, and for the
    # calls that write labels the label's tenant check that could not run.
    expected = [
        (INTERNAL, rf"Internal Server Error \[errorID={ERROR_ID}\]"),
        (
            INTERNAL,
            rf"Internal Server Error \[errorID={ERROR_ID}, "
            rf"reason: input: {operation} driver: bad connection\]",
        ),
    ]
    if operation in ("registerRuntime", "setRuntimeLabel"):
        expected.append(
            (
                {"error_code": 26, "error": "Unauthorized"},
                re.escape(
                    f"Unauthorized [reason=Tenant {internal_id} does not have access to the parent"
                    " of the currently created runtimeLabel: while checking for tenant access: "
                    "Internal Server Error: Unexpected error while executing SQL query]"
                ),
            )
        )
    else:
        expected.append(expected[0])
    for error, (extensions, message) in zip(errors, expected, strict=True):
        assert error["extensions"] == extensions
        assert re.fullmatch(message, error["message"]), error["message"]
    assert str(uuid.UUID(internal_id)) == internal_id != TENANT
    assert {r.outcome for r in sim.request_log(operation=operation)} == {Outcome.INJECTED_ERROR}
    counter = sim.counter(operation)
    assert (counter.attempts, counter.errors, counter.injected_errors) == (3, 3, 3)

    sim.update_faults(database_down=False)
    assert "errors" not in _call(director, operation, seeded).json()
    assert _took_effect(sim, operation, seeded)


def test_database_down_fails_reads_but_not_the_oauth_endpoint(
    sim: CompassSimulator, director: DirectorClient, http: httpx.Client
) -> None:
    _seed(sim)
    sim.update_faults(database_down=True)
    listed = director.post(documents.RUNTIMES_BY_LABEL, {"first": 10})
    assert listed.status_code == 200
    assert listed.json()["data"] is None
    assert listed.json()["errors"][0]["extensions"] == INTERNAL
    token = fetch_token(http, sim.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    assert token
    assert sim.counter("oauthToken").successes == 1


def test_database_faults_are_set_through_the_admin_api(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    url = f"{sim.admin_url}/_sim/faults"
    put = http.put(
        url,
        json={
            "database_down": True,
            "commit_then_error": {"registerRuntime": 2},
            "field_error_after_commit": {"registerRuntime": {"rate": 0.5}},
        },
    )
    assert put.status_code == 200, put.text
    assert put.json()["commit_then_error"] == {"registerRuntime": {"rate": 1.0, "remaining": 2}}
    assert put.json()["field_error_after_commit"] == {
        "registerRuntime": {"rate": 0.5, "remaining": None}
    }
    assert _call(director, "registerRuntime", None).json()["data"] is None
    assert sim.runtimes() == []  # down wins: nothing was written, no commit fault used
    assert sim.faults().commit_then_error["registerRuntime"].remaining == 2
    assert http.patch(url, json={"database_down": False}).json()["database_down"] is False
    for refused in (
        {"commit_then_error": {"runtimes": 1}},  # a query commits nothing
        {"field_error_after_commit": {"setRuntimeLabel": 1}},  # answers no Runtime
        {"commit_then_error": {"registerRuntime": -1}},
        {"database_down": "sometimes"},
    ):
        assert http.put(url, json=refused).status_code == 422, refused
