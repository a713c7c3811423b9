"""Compass simulator, Director: the runtime API with the real Director's semantics,
exercised through HTTP (tenants, validation, labels, filters, paging, tokens).

`tests/integration/real_director/test_contract.py` holds these answers to the real
Director; here they are pinned for the simulator alone, without building Director."""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from devenv.compass_sim import CompassSimulator, SimConfig, TokenKind
from devenv.compass_sim.config import ConsumerType, GlobalAccount, Subaccount
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
SUBACCOUNT_A = "5b1c7e0a-2f4d-4c8e-9a61-0d3f5e7a9b21"  # of A, region cf-eu10
SUBACCOUNT_A2 = "6c2d8f1b-3a5e-4d9f-8b72-1e4a6f8b0c32"  # of A, no region
SUBACCOUNT_B = "7d3e9a2c-4b6f-4e0a-9c83-2f5b7a9c1d43"  # of B
OTT_TTL = 1800
INTERNAL_ERROR = re.compile(
    r"Internal Server Error \[errorID=[0-9a-f-]{36}(, reason: (?P<reason>.*))?\]"
)


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(
        client_id="id",
        client_secret="secret",
        accounts={
            TENANT_A: GlobalAccount(
                subaccounts={
                    SUBACCOUNT_A: Subaccount(region="cf-eu10"),
                    SUBACCOUNT_A2: Subaccount(),
                }
            ),
            TENANT_B: GlobalAccount(subaccounts={SUBACCOUNT_B: Subaccount()}),
        },
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


def _internal_reason(response: httpx.Response) -> str | None:
    """The reason of Director's one code-10 entry (None: a database error, no reason)."""
    [error] = response.json()["errors"]
    assert error["extensions"] == {"error_code": 10, "error": "InternalError"}
    match = INTERNAL_ERROR.fullmatch(error["message"])
    assert match is not None, error["message"]
    return match.group("reason")


def _resolver_reason(response: httpx.Response) -> str:
    """The text of the plain error a resolver failed with: gqlgen puts the field's path
    (here always the alias `result`) before it."""
    reason = _internal_reason(response) or ""
    assert reason.startswith("input: result "), reason
    return reason.removeprefix("input: result ")


def _register(
    director: DirectorClient, name: str, *, tenant: str = TENANT_A, **fields: Any
) -> dict[str, Any]:
    result: dict[str, Any] = director.result(
        REGISTER_RUNTIME, {"in": {"name": name, **fields}}, tenant=tenant
    )
    return result


def _list(director: DirectorClient, *, tenant: str = TENANT_A, **variables: Any) -> dict[str, Any]:
    result: dict[str, Any] = director.result(LIST_RUNTIMES, variables, tenant=tenant)
    return result


def test_register_runtime_returns_the_stored_runtime(
    sim: CompassSimulator, director: DirectorClient, clock: ManualClock
) -> None:
    runtime = _register(
        director,
        "kyma-abc",
        description="a Kyma runtime",
        labels={"global_subaccount_id": SUBACCOUNT_A, "broker_plan_name": "azure"},
    )
    assert uuid.UUID(runtime["id"]).version == 4
    assert runtime["name"] == "kyma-abc"
    assert runtime["description"] == "a Kyma runtime"
    # Director marks every runtime it registers as normalized, and one an Integration
    # System registers as Kyma, in its subaccount's region.
    assert runtime["labels"] == {
        "global_subaccount_id": SUBACCOUNT_A,
        "broker_plan_name": "azure",
        "isNormalized": "true",
        "runtimeType": "kyma",
        "region": "cf-eu10",
    }
    assert runtime["applicationNamespace"] == "sap.kyma"
    assert runtime["status"]["condition"] == "INITIAL"
    created = datetime.fromisoformat(runtime["metadata"]["creationTimestamp"])
    assert abs(created.timestamp() - clock()) < 1.0
    assert runtime["status"]["timestamp"] == runtime["metadata"]["creationTimestamp"]
    [stored] = sim.runtimes(TENANT_A)
    assert (stored.id, stored.tenant, stored.name) == (runtime["id"], SUBACCOUNT_A, "kyma-abc")


@pytest.mark.parametrize(
    ("labels", "region"),
    [({}, ""), ({"global_subaccount_id": SUBACCOUNT_A2}, ""), ({"region": "mine"}, "")],
)
def test_region_is_the_subaccounts_or_empty(
    director: DirectorClient, labels: dict[str, Any], region: str
) -> None:
    assert _register(director, "regional", labels=labels)["labels"]["region"] == region


def test_a_technical_client_gets_no_kyma_labels(http: httpx.Client) -> None:
    config = SimConfig(
        client_id="id", client_secret="secret", consumer_type=ConsumerType.TECHNICAL_CLIENT
    )
    with CompassSimulator(config).running() as technical:
        client = DirectorClient(
            http, technical.director_url, token=technical.issue_access_token(), tenant=TENANT_A
        )
        runtime = _register(client, "plain", applicationNamespace="mine")
    assert runtime["labels"] == {"isNormalized": "true"}
    assert runtime["applicationNamespace"] == "mine"


def test_runtime_type_cannot_be_chosen_nor_changed(director: DirectorClient) -> None:
    runtime = _register(director, "typed", labels={"runtimeType": "other"})
    assert runtime["labels"]["runtimeType"] == "kyma"
    response = director.post(
        SET_RUNTIME_LABEL, {"runtimeID": runtime["id"], "key": "runtimeType", "value": "x"}
    )
    assert _errors(response) == [(22, "InvalidData")]
    assert response.json()["errors"][0]["message"] == (
        "Invalid data [reason=could not set unmodifiable label with key runtimeType]"
    )
    updated = director.result(
        UPDATE_RUNTIME, {"id": runtime["id"], "in": {"name": "typed", "labels": {}}}
    )
    assert updated["labels"]["runtimeType"] == "kyma"


def test_a_runtime_of_a_subaccount_is_seen_from_it_and_its_global_account(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    rid = _register(director, "owned", labels={"global_subaccount_id": SUBACCOUNT_A})["id"]
    for tenant in (TENANT_A, SUBACCOUNT_A):
        assert director.result(GET_RUNTIME, {"id": rid}, tenant=tenant)["id"] == rid
        assert [r["id"] for r in _list(director, tenant=tenant)["data"]] == [rid]
    for stranger in (SUBACCOUNT_A2, TENANT_B, SUBACCOUNT_B):
        assert director.result(GET_RUNTIME, {"id": rid}, tenant=stranger) is None
        assert _list(director, tenant=stranger)["data"] == []
    assert [r.id for r in sim.runtimes(TENANT_A)] == [rid]
    assert [r.id for r in sim.runtimes(SUBACCOUNT_A)] == [rid]
    # The global account manages it like its own.
    director.result(SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "k", "value": "v"})
    assert director.result(UNREGISTER_RUNTIME, {"id": rid})["id"] == rid
    assert sim.runtimes() == []


def test_a_subaccount_may_register_in_itself(director: DirectorClient) -> None:
    runtime = _register(
        director, "self", labels={"global_subaccount_id": SUBACCOUNT_A}, tenant=SUBACCOUNT_A
    )
    assert runtime["labels"]["region"] == "cf-eu10"
    assert director.result(GET_RUNTIME, {"id": runtime["id"]})["id"] == runtime["id"]


@pytest.mark.parametrize(
    ("tenant", "subaccount"),
    [
        (TENANT_A, SUBACCOUNT_B),  # another global account's subaccount
        (TENANT_A, TENANT_B),  # another global account
        (SUBACCOUNT_A, SUBACCOUNT_A2),  # a sibling
        (SUBACCOUNT_A, TENANT_A),  # its own parent
    ],
)
def test_the_subaccount_must_be_the_caller_or_its_child(
    sim: CompassSimulator, director: DirectorClient, tenant: str, subaccount: str
) -> None:
    response = director.post(
        REGISTER_RUNTIME,
        {"in": {"name": "x", "labels": {"global_subaccount_id": subaccount}}},
        tenant=tenant,
    )
    assert _errors(response) == [(27, "InvalidOperation")]
    assert response.json()["errors"][0]["message"] == (
        "The operation is not allowed [reason=Tenant provided in global_subaccount_id label "
        "should be child of the caller tenant]"
    )
    assert sim.runtimes() == []


def test_an_unknown_subaccount_is_not_found(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    response = director.post(
        REGISTER_RUNTIME, {"in": {"name": "x", "labels": {"global_subaccount_id": "not-synced"}}}
    )
    assert _errors(response) == [(20, "NotFound")]
    assert response.json()["errors"][0]["message"] == "Object not found [object=tenant]"
    assert sim.runtimes() == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (["a", "b"], "expected single value for label"),
        (5, "cannot cast label value: expected []string or string"),
    ],
)
def test_the_subaccount_label_is_one_string(
    director: DirectorClient, value: Any, reason: str
) -> None:
    response = director.post(
        REGISTER_RUNTIME, {"in": {"name": "x", "labels": {"global_subaccount_id": value}}}
    )
    assert _resolver_reason(response) == f"while converting global_subaccount_id label: {reason}"


def test_permissive_mode_adopts_a_new_subaccount_under_its_first_caller(
    http: httpx.Client,
) -> None:
    with CompassSimulator(SimConfig(client_id="id", client_secret="secret")).running() as open_sim:
        client = DirectorClient(
            http, open_sim.director_url, token=open_sim.issue_access_token(), tenant="ga-1"
        )
        labels = {"global_subaccount_id": "sa-new"}
        rid = _register(client, "first", labels=labels, tenant="ga-1")["id"]
        assert _register(client, "second", labels=labels, tenant="ga-1")["id"] != rid
        refused = client.post(
            REGISTER_RUNTIME, {"in": {"name": "x", "labels": labels}}, tenant="ga-2"
        )
        assert _errors(refused) == [(27, "InvalidOperation")]
        assert {r.tenant for r in open_sim.runtimes("ga-1")} == {"sa-new"}
        assert len(open_sim.runtimes("sa-new")) == 2
        open_sim.reset()
        # Forgotten with the state: a fresh start knows no subaccount.
        assert _register(client, "third", labels=labels, tenant="ga-2")["name"] == "third"


def test_scenarios_cannot_be_set_explicitly(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    response = director.post(
        REGISTER_RUNTIME, {"in": {"name": "x", "labels": {"scenarios": ["DEFAULT"]}}}
    )
    assert _resolver_reason(response) == "label with key scenarios cannot be set explicitly"
    assert sim.runtimes() == []


def test_a_label_key_longer_than_its_column_fails_in_the_database(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    long_key = "k" * 257
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "x", "labels": {long_key: "v"}}})
    assert _internal_reason(response) is None
    assert sim.runtimes() == []
    assert _register(director, "fits", labels={"k" * 256: "v"})["name"] == "fits"
    rid = _register(director, "target")["id"]
    # setRuntimeLabel validates the length itself.
    response = director.post(SET_RUNTIME_LABEL, {"runtimeID": rid, "key": long_key, "value": "v"})
    assert response.json()["errors"][0]["message"] == (
        "Invalid data LabelInput [key=the length must be no more than 256]"
    )


@pytest.mark.parametrize(
    ("query", "variables"),
    [
        (GET_RUNTIME, {"id": "not-a-uuid"}),
        (UNREGISTER_RUNTIME, {"id": "not-a-uuid"}),
        (UPDATE_RUNTIME, {"id": "not-a-uuid", "in": {"name": "x"}}),
        (REQUEST_ONE_TIME_TOKEN, {"id": "not-a-uuid"}),
        (SET_RUNTIME_LABEL, {"runtimeID": "not-a-uuid", "key": "k", "value": "v"}),
        (DELETE_RUNTIME_LABEL, {"runtimeID": "not-a-uuid", "key": "k"}),
    ],
)
def test_an_id_that_is_no_uuid_fails_in_the_database(
    director: DirectorClient, query: str, variables: dict[str, Any]
) -> None:
    assert _internal_reason(director.post(query, variables)) is None


def test_ids_are_read_as_postgres_reads_uuids(director: DirectorClient) -> None:
    rid = _register(director, "upper")["id"]
    assert director.result(GET_RUNTIME, {"id": rid.upper()})["id"] == rid


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


def test_every_invalid_field_and_label_key_is_named(director: DirectorClient) -> None:
    labels = {"bad-key": "x", "": "y", "ok": "z"}
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "a b", "labels": labels}})
    assert response.json()["errors"][0]["message"] == (
        "Invalid data RuntimeRegisterInput [labels=: cannot be blank; "
        "bad-key: must be in a valid format.; name=must be in a valid format]"
    )


def test_label_keys_with_underscores_and_long_descriptions_are_fine(
    director: DirectorClient,
) -> None:
    runtime = _register(director, "ok", description="d" * 2000, labels={"global_account_id": "g"})
    assert runtime["labels"]["global_account_id"] == "g"


@pytest.mark.parametrize(
    ("labels", "go_type"), [(["a"], "[]interface {}"), ("a", "string"), (1, "json.Number")]
)
def test_labels_must_be_a_json_object(
    sim: CompassSimulator, director: DirectorClient, labels: Any, go_type: str
) -> None:
    # gqlgen reads arguments inside the field: the field fails, not the document.
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "x", "labels": labels}})
    assert response.status_code == 200
    assert _internal_reason(response) == (
        f"input: result.in.labels unexpected Labels type: {go_type}, "
        "should be map[string]interface{}"
    )
    assert sim.runtimes() == []


def test_error_entries_carry_message_path_and_extensions(director: DirectorClient) -> None:
    response = director.post(UNREGISTER_RUNTIME, {"id": str(uuid.uuid4())})
    [error] = response.json()["errors"]
    assert error == {  # Director's presenter keeps no locations
        "message": "Object not found [object=runtime]",
        "path": ["result"],
        "extensions": {"error_code": 20, "error": "NotFound"},
    }


def test_tenant_header_is_required(director: DirectorClient) -> None:
    response = director.post(LIST_RUNTIMES, tenant=None)
    assert response.status_code == 200
    assert _errors(response) == [(24, "TenantRequired")]


def test_unknown_tenant_is_refused_when_tenants_are_configured(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    response = director.post(REGISTER_RUNTIME, {"in": {"name": "x"}}, tenant="someone-else")
    assert response.status_code == 400
    assert response.json() == {
        "errors": [
            {
                "message": "Tenant not found [externalTenant=someone-else]",
                "extensions": {"error_code": 25, "error": "TenantNotFound"},
            }
        ],
        "data": None,
    }
    assert sim.counter("registerRuntime").errors == 1


def test_the_tenants_shorthand_knows_global_accounts(http: httpx.Client) -> None:
    config = SimConfig(client_id="id", client_secret="secret", tenants=frozenset({"ga"}))
    with CompassSimulator(config).running() as listed:
        client = DirectorClient(
            http, listed.director_url, token=listed.issue_access_token(), tenant="ga"
        )
        assert _register(client, "known", tenant="ga")["name"] == "known"
        assert client.post(LIST_RUNTIMES, tenant="other").status_code == 400


def test_every_tenant_is_accepted_without_a_tenant_list(http: httpx.Client) -> None:
    open_sim = CompassSimulator(SimConfig(client_id="id", client_secret="secret"))
    with open_sim.running():
        client = DirectorClient(
            http, open_sim.director_url, token=open_sim.issue_access_token(), tenant="any-tenant"
        )
        assert _register(client, "anywhere", tenant="any-tenant")["name"] == "anywhere"
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
    ]:
        response = director.post(query, variables, **other)
        assert _errors(response) == [(20, "NotFound")], query
        assert response.json()["errors"][0]["message"] == "Object not found [object=runtime]"
    for query, variables in [
        (SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "k", "value": "x"}),
        (DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "k"}),
    ]:
        reason = _resolver_reason(director.post(query, variables, **other))
        assert reason == f"Runtime with ID {rid} doesn't exist", query
    [stored] = sim.runtimes()
    assert (stored.name, stored.labels["k"]) == ("private", "v")


def test_one_time_tokens_check_no_ownership(
    sim: CompassSimulator, director: DirectorClient
) -> None:
    rid = _register(director, "private")["id"]
    token = director.result(REQUEST_ONE_TIME_TOKEN, {"id": rid}, tenant=TENANT_B)
    assert token["used"] is False
    [record] = sim.connector_tokens(rid)
    assert record.tenant == TENANT_B


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
    assert updated["description"] == "old"  # kept unless given
    # Every label is replaced but the immutable runtimeType (region goes too).
    assert updated["labels"] == {"c": 3, "isNormalized": "true", "runtimeType": "kyma"}
    assert updated["status"]["condition"] == "INITIAL"
    assert updated["metadata"] == runtime["metadata"]
    assert updated["status"]["timestamp"] > runtime["status"]["timestamp"]
    assert director.result(GET_RUNTIME, {"id": runtime["id"]})["name"] == "after"


def test_update_of_missing_runtime_is_not_found(director: DirectorClient) -> None:
    response = director.post(UPDATE_RUNTIME, {"id": str(uuid.uuid4()), "in": {"name": "x"}})
    assert _errors(response) == [(20, "NotFound")]


def test_update_cannot_set_scenarios(director: DirectorClient) -> None:
    rid = _register(director, "x")["id"]
    response = director.post(
        UPDATE_RUNTIME, {"id": rid, "in": {"name": "x", "labels": {"scenarios": ["A"]}}}
    )
    assert _resolver_reason(response) == "label with key scenarios cannot be set explicitly"


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
        "one": _register(director, "one", labels={"instance": "abc", "zone": "eu"}),
        "two": _register(director, "two", labels={"instance": ["abc", "def"]}),
        "three": _register(
            director, "three", labels={"instance": "abcd", "meta": {"plan": "azure"}}
        ),
        "four": _register(director, "four", labels={"other": "x"}),
    }
    cases: list[tuple[list[dict[str, str]], set[str]]] = [
        ([{"key": "instance", "query": '"abc"'}], {"one", "two"}),
        ([{"key": "instance"}], {"one", "two", "three"}),
        ([{"key": "instance", "query": '["abc", "def"]'}], {"two"}),
        ([{"key": "meta", "query": '{"plan": "azure"}'}], {"three"}),
        ([{"key": "meta", "query": '{"plan": "gcp"}'}], set()),
        (
            [
                {"key": "instance", "query": '"abc"'},
                {"key": "zone", "query": '"eu"'},
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
    assert _internal_reason(response) is None


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
        assert page["pageInfo"]["startCursor"] == (after or "")
        seen += [r["name"] for r in page["data"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
        assert page["pageInfo"]["endCursor"] != page["pageInfo"]["startCursor"]
    assert seen == sorted(names)
    assert pages == 3
    assert page["pageInfo"]["endCursor"] == ""  # the last page
    assert page["pageInfo"]["startCursor"] == after


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        (
            "not a cursor",
            "while decoding page cursor: cursor is not correct: "
            "illegal base64 data at input byte 3",
        ),
        (
            base64.b64encode(b"offset:2").decode(),
            'while decoding page cursor: cursor is not correct: strconv.Atoi: parsing "offset:2": '
            "invalid syntax",
        ),
    ],
)
def test_a_cursor_that_does_not_decode_is_an_internal_error(
    director: DirectorClient, cursor: str, reason: str
) -> None:
    response = director.post(LIST_RUNTIMES, {"first": 2, "after": cursor})
    assert _resolver_reason(response) == reason


def test_a_negative_cursor_is_invalid_data(director: DirectorClient) -> None:
    cursor = base64.b64encode(b"DpKtJ4j9jDq-2").decode()
    response = director.post(LIST_RUNTIMES, {"first": 2, "after": cursor})
    assert _errors(response) == [(22, "InvalidData")]
    assert response.json()["errors"][0]["message"] == "Invalid data [reason=cursor is not correct]"


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
    assert first["usedAt"] == "0001-01-01T00:00:00Z"  # Go's zero time: never used
    assert first["type"] == "Runtime"
    created = datetime.fromisoformat(first["createdAt"])
    expires = datetime.fromisoformat(first["expiresAt"])
    assert expires - created == timedelta(seconds=OTT_TTL)
    assert abs(created.timestamp() - clock()) < 1.0
    raw = json.loads(first["raw"])
    assert list(raw) == [
        "token",
        "connectorURL",
        "used",
        "expiresAt",
        "createdAt",
        "usedAt",
        "type",
        "scenario_groups",
    ]
    assert (raw["token"], raw["connectorURL"], raw["used"]) == (
        first["token"],
        sim.connector_url,
        False,
    )
    assert datetime.fromisoformat(raw["expiresAt"]) - expires < timedelta(seconds=1)
    assert base64.b64decode(first["rawEncoded"]).decode() == first["raw"]
    tokens = sim.connector_tokens(runtime["id"])
    assert len(tokens) == 2
    assert {t.kind for t in tokens} == {TokenKind.ONE_TIME}
    assert {t.tenant for t in tokens} == {TENANT_A}
    assert all(first["token"] not in t.model_dump_json() for t in tokens)


def test_one_time_token_for_a_missing_runtime_is_not_allowed(director: DirectorClient) -> None:
    gone = _register(director, "gone")["id"]
    director.result(UNREGISTER_RUNTIME, {"id": gone})
    for runtime_id in (str(uuid.uuid4()), gone):
        response = director.post(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})
        assert _errors(response) == [(27, "InvalidOperation")]
        assert response.json()["errors"][0]["message"] == (
            "The operation is not allowed [object=systemAuth; "
            "reason=The referenced entity does not exists]"
        )


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
    assert labels == {
        "keep": "changed",
        "new_key": value,
        "isNormalized": "true",
        "runtimeType": "kyma",
        "region": "",
    }

    deleted = director.result(DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "new_key"})
    assert deleted == {"key": "new_key", "value": value}
    assert "new_key" not in director.result(GET_RUNTIME, {"id": rid})["labels"]
    again = director.post(DELETE_RUNTIME_LABEL, {"runtimeID": rid, "key": "new_key"})
    assert _errors(again) == [(20, "NotFound")]
    assert again.json()["errors"][0]["message"] == "Object not found [object=runtimeLabel]"


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("bad-key", "x", 22),
        ("", "x", 22),
        ("fine", "", 22),
        ("fine", False, 22),
        ("fine", [], 22),
        ("fine", None, None),
    ],
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


def test_set_label_of_missing_runtime_is_an_internal_error(director: DirectorClient) -> None:
    missing = str(uuid.uuid4())
    response = director.post(SET_RUNTIME_LABEL, {"runtimeID": missing, "key": "k", "value": "v"})
    assert _resolver_reason(response) == f"Runtime with ID {missing} doesn't exist"


def test_scenarios_label_cannot_be_set_nor_deleted(director: DirectorClient) -> None:
    rid = _register(director, "x")["id"]
    response = director.post(
        SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "scenarios", "value": "A"}
    )
    assert _resolver_reason(response) == "label with key scenarios cannot be set explicitly"


def test_filters_on_runtime_type_take_a_json_path(director: DirectorClient) -> None:
    rid = _register(director, "kyma")["id"]
    page = _list(director, filter=[{"key": "runtimeType", "query": '$[*] ? (@ == "kyma")'}])
    assert [r["id"] for r in page["data"]] == [rid]
    plain = director.post(LIST_RUNTIMES, {"filter": [{"key": "runtimeType", "query": '"kyma"'}]})
    assert _internal_reason(plain) is None


def test_a_scenarios_filter_finds_nothing_without_formations(director: DirectorClient) -> None:
    _register(director, "kyma")
    query = '$[*] ? (@ == "DEFAULT")'
    # Formations are looked up before the cursor is read: a bad cursor goes unnoticed.
    page = _list(director, filter=[{"key": "scenarios", "query": query}], after="not a cursor")
    assert page == {
        "data": [],
        "totalCount": 0,
        "pageInfo": {"startCursor": "not a cursor", "endCursor": "", "hasNextPage": False},
    }
    plain = director.post(LIST_RUNTIMES, {"filter": [{"key": "scenarios", "query": '"A"'}]})
    assert _internal_reason(plain) is None


def test_label_values_may_be_zero(director: DirectorClient) -> None:
    rid = _register(director, "zero")["id"]
    assert director.result(SET_RUNTIME_LABEL, {"runtimeID": rid, "key": "n", "value": 0}) == {
        "key": "n",
        "value": 0,
    }


def test_labels_field_takes_a_key(director: DirectorClient) -> None:
    rid = _register(director, "keyed", labels={"a": "1", "b": "2"})["id"]
    assert director.result(RUNTIME_LABEL, {"id": rid, "key": "b"}) == {"labels": {"b": "2"}}
    assert director.result(RUNTIME_LABEL, {"id": rid, "key": "zzz"}) == {"labels": {}}
    labels = director.result(RUNTIME_LABEL, {"id": rid})["labels"]
    assert set(labels) == {"a", "b", "isNormalized", "runtimeType", "region"}


def test_malformed_requests(sim: CompassSimulator, director: DirectorClient) -> None:
    headers = {"Authorization": f"Bearer {director.token}", "Tenant": TENANT_A}
    not_json = director.client.post(sim.director_url, content=b"{", headers=headers)
    assert not_json.status_code == 400
    # What gqlgen cannot execute reaches Director's error presenter as an untyped error.
    syntax = director.post("query { runtimes(first: 1) {")
    assert syntax.status_code == 422
    assert syntax.json()["data"] is None
    assert (_internal_reason(syntax) or "").startswith("input:1: Syntax Error")
    unknown = director.post("query {\n applications { totalCount } }")
    assert unknown.status_code == 422
    assert (_internal_reason(unknown) or "").startswith("input:2: Cannot query field")
    assert "path" not in unknown.json()["errors"][0]
    null = director.post(SET_RUNTIME_LABEL, {"runtimeID": None, "key": "k", "value": "v"})
    assert null.status_code == 422
    assert (_internal_reason(null) or "").startswith("input: variable.runtimeID ")


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
