"""Compass simulator, Director: the runtime API with the real Director's semantics,
exercised through HTTP (tenants, validation, labels, filters, paging, tokens)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from devenv.compass_sim import CompassSimulator, SimConfig, TokenKind
from devenv.compass_sim.testing import (
    DELETE_RUNTIME_LABEL,
    GET_RUNTIME,
    LIST_RUNTIMES,
    REGISTER_RUNTIME,
    REQUEST_ONE_TIME_TOKEN,
    RUNTIME_LABEL,
    SET_RUNTIME_LABEL,
    UNREGISTER_RUNTIME,
    UPDATE_RUNTIME,
    DirectorClient,
    ManualClock,
)

pytestmark = pytest.mark.timeout(60)

TENANT_A = "3e64ebae-38b5-46a0-b1ed-9ccee153a0ae"
TENANT_B = "8f6a0c8e-0b3c-4a5f-9d3e-2f1b5c7d9e10"
OTT_TTL = 1800


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(
        client_id="id",
        client_secret="secret",
        tenants=frozenset({TENANT_A, TENANT_B}),
        ott_ttl_seconds=OTT_TTL,
    )
    with CompassSimulator(config, clock=clock).running() as simulator:
        yield simulator


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


@pytest.fixture
def director(sim: CompassSimulator, http: httpx.Client) -> DirectorClient:
    return DirectorClient(http, sim.director_url, token=sim.issue_access_token(), tenant=TENANT_A)


def _errors(response: httpx.Response) -> list[tuple[int, str]]:
    return [
        (e["extensions"]["error_code"], e["extensions"]["error"]) for e in response.json()["errors"]
    ]


def _register(director: DirectorClient, name: str, **fields: Any) -> dict[str, Any]:
    result: dict[str, Any] = director.result(REGISTER_RUNTIME, {"in": {"name": name, **fields}})
    return result


def _list(director: DirectorClient, **variables: Any) -> dict[str, Any]:
    result: dict[str, Any] = director.result(LIST_RUNTIMES, variables)
    return result


def test_register_runtime_returns_the_stored_runtime(
    sim: CompassSimulator, director: DirectorClient, clock: ManualClock
) -> None:
    runtime = _register(
        director,
        "kyma-abc",
        description="a Kyma runtime",
        labels={"global_subaccount_id": "sa-1", "broker_plan_name": "azure"},
    )
    assert uuid.UUID(runtime["id"]).version == 4
    assert runtime["name"] == "kyma-abc"
    assert runtime["description"] == "a Kyma runtime"
    # Director marks every runtime it registers as normalized.
    assert runtime["labels"] == {
        "global_subaccount_id": "sa-1",
        "broker_plan_name": "azure",
        "isNormalized": "true",
    }
    assert runtime["status"]["condition"] == "INITIAL"
    created = datetime.fromisoformat(runtime["metadata"]["creationTimestamp"])
    assert abs(created.timestamp() - clock()) < 1.0
    assert runtime["status"]["timestamp"] == runtime["metadata"]["creationTimestamp"]
    [stored] = sim.runtimes(TENANT_A)
    assert (stored.id, stored.tenant, stored.name) == (runtime["id"], TENANT_A, "kyma-abc")


def test_runtime_names_are_not_unique(director: DirectorClient) -> None:
    first = _register(director, "same-name")
    second = _register(director, "same-name")
    assert first["id"] != second["id"]
    assert _list(director)["totalCount"] == 2


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "cannot be blank"),
        ("a" * 257, "the length must be between 1 and 256"),
        ("has space", "must be in a valid format"),
        ("shoot/abc", "must be in a valid format"),
        ("é", "must be in a valid format"),
    ],
)
def test_invalid_runtime_names_are_rejected(
    sim: CompassSimulator, director: DirectorClient, name: str, problem: str
) -> None:
    response = director.post(REGISTER_RUNTIME, {"in": {"name": name}})
    assert response.status_code == 200
    assert response.json()["data"] is None
    assert _errors(response) == [(22, "InvalidData")]
    assert response.json()["errors"][0]["message"] == (
        f"Invalid data RuntimeRegisterInput [name={problem}]"
    )
    assert sim.runtimes() == []


@pytest.mark.parametrize(
    "name",
    [
        "c-7d3a1b2-AbQxZr",  # compass-manager: <shoot>-<random letters>, upper case included
        "kyma-shoot-XYZQWE",
        "a" * 256,
        "1abc",
        "ab_c",
        "kyma.runtime-1",
    ],
)
def test_valid_runtime_names_are_accepted(director: DirectorClient, name: str) -> None:
    assert _register(director, name)["name"] == name


@pytest.mark.parametrize(
    "fields",
    [
        {"labels": {"bad-key": "x"}},
        {"labels": {"": "x"}},
        {"description": "d" * 2001},
    ],
)
def test_invalid_labels_and_descriptions_are_rejected(
    sim: CompassSimulator, director: DirectorClient, fields: dict[str, Any]
) -> None:
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "valid-name", **fields}})
    assert _errors(response) == [(22, "InvalidData")]
    assert sim.runtimes() == []


def test_label_keys_with_underscores_and_long_descriptions_are_fine(
    director: DirectorClient,
) -> None:
    runtime = _register(director, "ok", description="d" * 2000, labels={"global_account_id": "g"})
    assert runtime["labels"]["global_account_id"] == "g"


def test_labels_must_be_a_json_object(sim: CompassSimulator, director: DirectorClient) -> None:
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "x", "labels": ["a"]}})
    assert response.status_code == 422
    assert "labels must be a JSON object" in response.json()["errors"][0]["message"]
    assert sim.runtimes() == []


def test_error_entries_carry_message_path_and_extensions(director: DirectorClient) -> None:
    response = director.post(UNREGISTER_RUNTIME, {"id": str(uuid.uuid4())})
    [error] = response.json()["errors"]
    assert error["path"] == ["result"]
    assert error["message"].startswith("Object not found")
    assert error["extensions"] == {"error_code": 20, "error": "NotFound"}


def test_tenant_header_is_required(director: DirectorClient) -> None:
    response = director.post(LIST_RUNTIMES, tenant=None)
    assert response.status_code == 200
    assert _errors(response) == [(24, "TenantRequired")]


def test_unknown_tenant_is_refused_when_tenants_are_configured(director: DirectorClient) -> None:
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "x"}}, tenant="someone-else")
    assert _errors(response) == [(25, "TenantNotFound")]


def test_every_tenant_is_accepted_without_a_tenant_list(http: httpx.Client) -> None:
    open_sim = CompassSimulator(SimConfig(client_id="id", client_secret="secret"))
    with open_sim.running():
        client = DirectorClient(
            http, open_sim.director_url, token=open_sim.issue_access_token(), tenant="any-tenant"
        )
        assert _register(client, "anywhere")["name"] == "anywhere"
        assert [r.tenant for r in open_sim.runtimes()] == ["any-tenant"]


def test_runtimes_are_invisible_to_other_tenants(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    runtime = _register(director, "private", labels={"k": "v"})
    rid = runtime["id"]
    other = {"tenant": TENANT_B}
    assert director.result(GET_RUNTIME, {"id": rid}, **other) is None
    assert _list(director, **{})["totalCount"] == 1
    assert director.result(LIST_RUNTIMES, {}, **other)["totalCount"] == 0
    for query, variables in [
        (UPDATE_RUNTIME, {"id": rid, "in": {"name": "stolen"}}),
        (UNREGISTER_RUNTIME, {"id": rid}),
        (SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "k", "value": "x"}),
        (DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "k"}),
        (REQUEST_ONE_TIME_TOKEN, {"id": rid}),
    ]:
        assert _errors(director.post(query, variables, **other)) == [(20, "NotFound")], query
    [stored] = sim.runtimes()
    assert (stored.name, stored.labels["k"]) == ("private", "v")
    assert sim.connector_tokens() == []


def test_runtime_query_returns_null_when_missing(director: DirectorClient) -> None:
    response = director.post(GET_RUNTIME, {"id": str(uuid.uuid4())})
    assert response.json() == {"data": {"result": None}}


def test_update_replaces_name_description_status_and_all_labels(
    director: DirectorClient, clock: ManualClock
) -> None:
    runtime = _register(
        director,
        "before",
        description="old",
        labels={"a": 1, "b": 2},
        statusCondition="CONNECTED",
    )
    assert runtime["status"]["condition"] == "CONNECTED"
    clock.advance(5)
    updated = director.result(
        UPDATE_RUNTIME, {"id": runtime["id"], "in": {"name": "after", "labels": {"c": 3}}}
    )
    assert updated["id"] == runtime["id"]
    assert updated["name"] == "after"
    assert updated["description"] is None
    assert updated["labels"] == {"c": 3, "isNormalized": "true"}
    assert updated["status"]["condition"] == "INITIAL"
    assert updated["metadata"] == runtime["metadata"]
    assert updated["status"]["timestamp"] > runtime["status"]["timestamp"]
    assert director.result(GET_RUNTIME, {"id": runtime["id"]})["name"] == "after"


def test_update_of_missing_runtime_is_not_found(director: DirectorClient) -> None:
    response = director.post(UPDATE_RUNTIME, {"id": str(uuid.uuid4()), "in": {"name": "x"}})
    assert _errors(response) == [(20, "NotFound")]


def test_update_validates_its_input(director: DirectorClient) -> None:
    runtime = _register(director, "valid")
    response = director.post(UPDATE_RUNTIME, {"id": runtime["id"], "in": {"name": "In valid"}})
    assert _errors(response) == [(22, "InvalidData")]
    assert response.json()["errors"][0]["message"] == (
        "Invalid data RuntimeUpdateInput [name=must be in a valid format]"
    )
    assert director.result(GET_RUNTIME, {"id": runtime["id"]})["name"] == "valid"
    renamed = {"name": "shoot-AbCdEf"}
    assert director.result(UPDATE_RUNTIME, {"id": runtime["id"], "in": renamed})["name"] == (
        "shoot-AbCdEf"
    )


def test_unregister_returns_the_runtime_then_it_is_gone(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    runtime = _register(director, "short-lived")
    director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime["id"]})
    removed = director.result(UNREGISTER_RUNTIME, {"id": runtime["id"]})
    assert (removed["id"], removed["name"]) == (runtime["id"], "short-lived")
    assert director.result(GET_RUNTIME, {"id": runtime["id"]}) is None
    assert sim.runtimes() == []
    assert sim.connector_tokens() == []  # its tokens went with it
    again = director.post(UNREGISTER_RUNTIME, {"id": runtime["id"]})
    assert _errors(again) == [(20, "NotFound")]


def test_label_filters_are_anded_and_match_by_json_containment(director: DirectorClient) -> None:
    ids = {
        "one": _register(director, "one", labels={"global_subaccount_id": "abc", "region": "eu"}),
        "two": _register(director, "two", labels={"global_subaccount_id": ["abc", "def"]}),
        "three": _register(
            director, "three", labels={"global_subaccount_id": "abcd", "meta": {"plan": "azure"}}
        ),
        "four": _register(director, "four", labels={"other": "x"}),
    }
    cases: list[tuple[list[dict[str, str]], set[str]]] = [
        ([{"key": "global_subaccount_id", "query": '"abc"'}], {"one", "two"}),
        ([{"key": "global_subaccount_id"}], {"one", "two", "three"}),
        ([{"key": "global_subaccount_id", "query": '["abc", "def"]'}], {"two"}),
        ([{"key": "meta", "query": '{"plan": "azure"}'}], {"three"}),
        ([{"key": "meta", "query": '{"plan": "gcp"}'}], set()),
        (
            [
                {"key": "global_subaccount_id", "query": '"abc"'},
                {"key": "region", "query": '"eu"'},
            ],
            {"one"},
        ),
        ([{"key": "missing"}], set()),
        ([], {"one", "two", "three", "four"}),
    ]
    for filters, expected in cases:
        page = _list(director, filter=filters)
        found = {r["name"] for r in page["data"]}
        assert found == expected, filters
        assert page["totalCount"] == len(expected)
        assert all(r["id"] == ids[r["name"]]["id"] for r in page["data"])


def test_label_filter_query_must_be_json(director: DirectorClient) -> None:
    response = director.post(LIST_RUNTIMES, {"filter": [{"key": "k", "query": "abc"}]})
    assert _errors(response) == [(22, "InvalidData")]


@pytest.mark.parametrize(
    ("first", "message"),
    [
        (0, "page size must be between 1 and 200"),
        (201, "page size must be between 1 and 200"),
        (None, "missing required parameter 'first'"),
    ],
)
def test_page_size_must_be_between_1_and_200(
    director: DirectorClient, first: int | None, message: str
) -> None:
    response = director.post(LIST_RUNTIMES, {"first": first})
    assert _errors(response) == [(22, "InvalidData")]
    assert message in response.json()["errors"][0]["message"]


def test_first_defaults_to_200(director: DirectorClient) -> None:
    for i in range(3):
        _register(director, f"rt-{i}")
    page = _list(director)  # `first` not given at all: the schema default applies
    assert len(page["data"]) == 3
    assert page["pageInfo"]["hasNextPage"] is False
    assert len(_list(director, first=200)["data"]) == 3


def test_cursor_paging_walks_all_runtimes_in_name_order(director: DirectorClient) -> None:
    names = ["echo", "alpha", "delta", "charlie", "bravo"]
    for name in names:
        _register(director, name, labels={"set": "paging"})
    _register(director, "zulu")  # filtered out below
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = _list(director, first=2, after=after, filter=[{"key": "set"}])
        pages += 1
        assert page["totalCount"] == 5
        seen += [r["name"] for r in page["data"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
        assert page["pageInfo"]["endCursor"] != page["pageInfo"]["startCursor"]
    assert seen == sorted(names)
    assert pages == 3


def test_invalid_cursor_is_rejected(director: DirectorClient) -> None:
    response = director.post(LIST_RUNTIMES, {"first": 2, "after": "not a cursor"})
    assert _errors(response) == [(22, "InvalidData")]


def test_one_time_token_for_runtime(
    sim: CompassSimulator, director: DirectorClient, clock: ManualClock
) -> None:
    runtime = _register(director, "with-token")
    first = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime["id"]})
    second = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime["id"]})
    assert len(base64.urlsafe_b64decode(first["token"])) == 64
    assert first["token"] != second["token"]
    assert first["connectorURL"] == sim.connector_url
    assert first["used"] is False
    assert first["usedAt"] is None
    assert first["type"] == "Runtime"
    created = datetime.fromisoformat(first["createdAt"])
    expires = datetime.fromisoformat(first["expiresAt"])
    assert expires - created == timedelta(seconds=OTT_TTL)
    assert abs(created.timestamp() - clock()) < 1.0
    raw = json.loads(first["raw"])
    assert raw == {"token": first["token"], "connectorURL": sim.connector_url}
    assert base64.b64decode(first["rawEncoded"]).decode() == first["raw"]
    tokens = sim.connector_tokens(runtime["id"])
    assert len(tokens) == 2
    assert {t.kind for t in tokens} == {TokenKind.ONE_TIME}
    assert {t.tenant for t in tokens} == {TENANT_A}
    assert all(first["token"] not in t.model_dump_json() for t in tokens)


def test_one_time_token_for_missing_runtime_is_not_found(director: DirectorClient) -> None:
    response = director.post(REQUEST_ONE_TIME_TOKEN, {"id": str(uuid.uuid4())})
    assert _errors(response) == [(20, "NotFound")]


def test_set_and_delete_runtime_labels(director: DirectorClient) -> None:
    runtime = _register(director, "labelled", labels={"keep": "me"})
    rid = runtime["id"]
    value = {"plans": ["a", "b"], "n": 1}
    set_result = director.result(
        SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "new_key", "value": value}
    )
    assert set_result == {"key": "new_key", "value": value}
    director.result(SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "keep", "value": "changed"})
    labels = director.result(GET_RUNTIME, {"id": rid})["labels"]
    assert labels == {"keep": "changed", "new_key": value, "isNormalized": "true"}

    deleted = director.result(DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "new_key"})
    assert deleted == {"key": "new_key", "value": value}
    assert "new_key" not in director.result(GET_RUNTIME, {"id": rid})["labels"]
    again = director.post(DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "new_key"})
    assert _errors(again) == [(20, "NotFound")]


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [("bad-key", "x", 22), ("", "x", 22), ("fine", "", 22), ("fine", None, None)],
)
def test_set_runtime_label_validates_key_and_value(
    director: DirectorClient, key: str, value: Any, code: int | None
) -> None:
    rid = _register(director, "target")["id"]
    response = director.post(SET_RUNTIME_LABEL, {"runtimeID": rid, "key": key, "value": value})
    if code is None:  # null for a non-null argument: the request itself is invalid
        assert response.status_code == 422
    else:
        assert _errors(response) == [(code, "InvalidData")]
    assert key not in director.result(GET_RUNTIME, {"id": rid})["labels"]


def test_set_label_of_missing_runtime_is_not_found(director: DirectorClient) -> None:
    response = director.post(
        SET_RUNTIME_LABEL, {"runtimeID": str(uuid.uuid4()), "key": "k", "value": "v"}
    )
    assert _errors(response) == [(20, "NotFound")]


def test_labels_field_takes_a_key(director: DirectorClient) -> None:
    rid = _register(director, "keyed", labels={"a": "1", "b": "2"})["id"]
    assert director.result(RUNTIME_LABEL, {"id": rid, "key": "b"}) == {"labels": {"b": "2"}}
    assert director.result(RUNTIME_LABEL, {"id": rid, "key": "zzz"}) == {"labels": {}}
    assert set(director.result(RUNTIME_LABEL, {"id": rid})["labels"]) == {"a", "b", "isNormalized"}


def test_malformed_requests(sim: CompassSimulator, director: DirectorClient) -> None:
    headers = {"Authorization": f"Bearer {director.token}", "Tenant": TENANT_A}
    not_json = director.client.post(sim.director_url, content=b"{", headers=headers)
    assert not_json.status_code == 400
    syntax = director.post("query { runtimes(first: 1) {")
    assert syntax.status_code == 422
    assert syntax.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED"
    unknown = director.post("query { applications { totalCount } }")
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"


def test_several_root_fields_in_one_request_are_counted_separately(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    response = director.post(
        'mutation { a: registerRuntime(in: {name: "a"}) { id } '
        'b: registerRuntime(in: {name: "b b"}) { id } }'
    )
    body = response.json()
    assert body["data"] is None  # b failed and registerRuntime is non-null
    assert [e["path"] for e in body["errors"]] == [["b"]]
    assert len(sim.runtimes()) == 1
    counter = sim.counter("registerRuntime")
    assert (counter.attempts, counter.successes, counter.errors) == (2, 1, 1)
