"""The simulator answers as the real Director does: one contract, the real Director the oracle.

Every case is data: a GraphQL document, its variables, the tenant that sends it (a role in
a world of tenants made for the case alone), steps that set the scene, and an extractor
that says what of the answer is compared. Each case runs against the simulator and against
the real Director (behind its stand-in gateway, `real_compass`), and the two extracts must
be equal: HTTP status, every error entry's `error_code`, `error`, `path` and message
(runtime and tenant IDs by role, other UUIDs and timestamps normalised), the data's shape
and values, the labels Director adds, token fields, cursors. Where the notes
(`../shared/real-compass-notes.md`) state the real answer, `check` pins it on both sides,
so two equal but wrong answers fail too.

`ROWS` lists the rows of the notes' table "Where the real Director answers differently
from our simulator" and the "Same:" list; every row is covered by at least one case
(`test_every_row_is_covered`).

Where the simulator differs on purpose:
- Faults: injected GraphQL errors and HTTP statuses, `down` (refuse / drop / 503), rate
  limits (429), latency and a capacity limit exist only in the simulator; Compass offers
  no switch for them. The one fault both have, an answer lost after Director acted, is
  compared (`lost-register-answer`): 504, and the runtime exists.
- A refused bearer token is answered by the gateway, not by Director: both say 401, with
  different bodies (Oathkeeper's JSON here, a code-26 GraphQL error in the simulator);
  only the status is compared (`unauthorized`).
- Parser texts inside code-10 answers to documents that do not validate come from
  different GraphQL libraries (gqlparser, graphql-core): compared up to the line number.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx
import pytest

from control_plane_broker.director import documents as broker
from devenv.compass_sim import READ_SCOPE, WRITE_SCOPE, CompassSimulator, SimConfig
from devenv.compass_sim.config import GlobalAccount, Subaccount
from devenv.compass_sim.testing import fetch_token

pytestmark = pytest.mark.timeout(900)

# -- the documents (the broker's own, plus what Director's other answers need) ---------------

RUNTIME = "id name description labels applicationNamespace status { condition }"
REGISTER = (
    "mutation RegisterRuntime($in: RuntimeRegisterInput!) "
    f"{{ registerRuntime(in: $in) {{ {RUNTIME} }} }}"
)
UPDATE = (
    "mutation UpdateRuntime($id: ID!, $in: RuntimeUpdateInput!) "
    f"{{ updateRuntime(id: $id, in: $in) {{ {RUNTIME} }} }}"
)
UNREGISTER = "mutation UnregisterRuntime($id: ID!) { unregisterRuntime(id: $id) { id } }"
GET = f"query GetRuntime($id: ID!) {{ runtime(id: $id) {{ {RUNTIME} }} }}"
LIST = (
    "query RuntimesByLabel($filter: [LabelFilter!], $first: Int, $after: PageCursor) "
    "{ runtimes(filter: $filter, first: $first, after: $after) "
    f"{{ data {{ {RUNTIME} }} pageInfo {{ startCursor endCursor hasNextPage }} totalCount }} }}"
)
TOKEN = (
    "mutation RequestOneTimeTokenForRuntime($id: ID!) "
    "{ requestOneTimeTokenForRuntime(id: $id) "
    "{ token connectorURL used expiresAt createdAt usedAt type raw rawEncoded } }"
)
SET_LABEL = (
    "mutation SetRuntimeLabel($runtimeID: ID!, $key: String!, $value: Any!) "
    "{ setRuntimeLabel(runtimeID: $runtimeID, key: $key, value: $value) { key value } }"
)
DELETE_LABEL = (
    "mutation DeleteRuntimeLabel($runtimeID: ID!, $key: String!) "
    "{ deleteRuntimeLabel(runtimeID: $runtimeID, key: $key) { key value } }"
)
UNKNOWN_FIELD = "query Broken($id: ID!) {\n  runtime(id: $id) {\n    id\n    nope\n  }\n}"

ALL_SCOPES = (READ_SCOPE, WRITE_SCOPE)
REGION = "cf-eu10"

# -- the rows to cover ---------------------------------------------------------------------

ROWS: dict[str, str] = {
    "same-page-size": "page size rule (1..200, code 22)",
    "same-name": "runtime name rule and messages",
    "same-label-rules": "label key / blank value rules",
    "same-normalized": 'isNormalized: "true" added',
    "same-update": "updateRuntime replaces all labels",
    "same-names-not-unique": "names not unique",
    "same-no-tenant": "no Tenant -> code 24",
    "same-scope": "missing scope -> code 23",
    "same-unregister": "unregisterRuntime -> {id}",
    "same-token": "one-time token shape (88 chars, used false, expiresAt 60 min ahead)",
    "kyma-labels": "register as Integration System: runtimeType kyma, region",
    "unknown-subaccount": "unknown global_subaccount_id: code 20 object=tenant",
    "not-a-child": "global_subaccount_id not a child of the caller: code 27",
    "child-subaccount": "child subaccount owns the runtime; listed from both",
    "token-missing": "one-time token for a missing / unregistered runtime: code 27",
    "token-other-tenant": "one-time token for another tenant's runtime: issued",
    "set-label-missing": "setRuntimeLabel on a missing runtime: code 10 doesn't exist",
    "code-10-inputs": "non-UUID ID; bad cursor; non-JSON query; label key over 256: code 10",
    "scenarios": "scenarios label on register: code 10 cannot be set explicitly",
    "unknown-tenant": "unknown tenant: HTTP 400, code 25, no path",
    "validation": "GraphQL validation error: HTTP 422, code 10",
    "end-cursor": 'pageInfo.endCursor "" on the last page, else an opaque base64 offset',
    "messages": "Object not found [object=runtime]; [labels=bad-key: must be in a valid format.]",
}

# -- the world of one case -------------------------------------------------------------------

ROLES = ("ga", "sa", "sa_bare", "other_ga", "other_sa", "unknown", "unknown_sa")


@dataclass(frozen=True)
class World:
    """Fresh tenants for one case: a global account with a subaccount in REGION and one
    without a region, another global account with a subaccount, and two IDs nobody knows."""

    ids: dict[str, str]

    @classmethod
    def new(cls) -> World:
        return cls({role: str(uuid.uuid4()) for role in ROLES})

    def accounts(self) -> dict[str, GlobalAccount]:
        i = self.ids
        return {
            i["ga"]: GlobalAccount(
                subaccounts={i["sa"]: Subaccount(region=REGION), i["sa_bare"]: Subaccount()}
            ),
            i["other_ga"]: GlobalAccount(subaccounts={i["other_sa"]: Subaccount()}),
        }


@dataclass
class Answer:
    status: int
    body: Any  # parsed JSON, or the text of a non-JSON answer

    def data(self, field_name: str) -> Any:
        return self.body["data"][field_name]


@dataclass
class Ctx:
    """What one side knows while running a case: tenant IDs by role, runtimes by name."""

    world: World
    connector_url: str
    runtimes: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def names(self) -> dict[str, str]:
        """ID -> the placeholder it is compared as."""
        names = {v: f"<{k}>" for k, v in self.world.ids.items()}
        names.update({v: f"<runtime {k}>" for k, v in self.runtimes.items()})
        return names


class Faults(Protocol):
    def lose_next(self, operation: str) -> None: ...
    def clear(self) -> None: ...


@dataclass
class Side:
    name: str
    director_url: str
    token_url: str
    client_id: str
    client_secret: str
    connector_url: str
    faults: Faults
    http: httpx.Client
    _tokens: dict[tuple[str, ...], str] = field(default_factory=dict)

    def token(self, scopes: tuple[str, ...]) -> str:
        if scopes not in self._tokens:
            self._tokens[scopes] = fetch_token(
                self.http,
                self.token_url,
                client_id=self.client_id,
                client_secret=self.client_secret,
                scopes=scopes,
            )
        return self._tokens[scopes]

    def post(
        self,
        document: str,
        variables: dict[str, Any],
        *,
        tenant: str | None,
        scopes: tuple[str, ...] = ALL_SCOPES,
        bearer: str | None = None,
    ) -> Answer:
        headers = {"Authorization": f"Bearer {bearer or self.token(scopes)}"}
        if tenant is not None:
            headers["Tenant"] = tenant
        response = self.http.post(
            self.director_url, json={"query": document, "variables": variables}, headers=headers
        )
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        return Answer(response.status_code, body)


# -- steps that set the scene (run the same on both sides) -----------------------------------

Step = Callable[[Side, Ctx], None]


def _tenant(ctx: Ctx, role: str | None) -> str | None:
    return None if role is None else ctx.world.ids[role]


def _assert_ok(side: Side, answer: Answer) -> None:
    assert answer.status == 200, (side.name, answer)
    assert not answer.body.get("errors"), (side.name, answer)


def register(
    name: str, *, tenant: str = "ga", labels: dict[str, Any] | None = None, lost: bool = False
) -> Step:
    """Register runtime `name` (labels may name roles as "<role>"); `lost`: its answer is lost."""

    def step(side: Side, ctx: Ctx) -> None:
        given = {k: _resolve(v, ctx) for k, v in (labels or {}).items()}
        if lost:
            side.faults.lose_next("registerRuntime")
        answer = side.post(
            REGISTER, {"in": {"name": name, "labels": given}}, tenant=_tenant(ctx, tenant)
        )
        if lost:
            assert answer.status == 504, (side.name, answer)
            return
        _assert_ok(side, answer)
        ctx.runtimes[name] = answer.data("registerRuntime")["id"]

    return step


def unregister(name: str, *, tenant: str = "ga") -> Step:
    def step(side: Side, ctx: Ctx) -> None:
        answer = side.post(UNREGISTER, {"id": ctx.runtimes[name]}, tenant=_tenant(ctx, tenant))
        _assert_ok(side, answer)

    return step


def remember_cursor(first: int, *, tenant: str = "ga") -> Step:
    """Keep the endCursor of the first page of `first` runtimes as ctx.values["cursor"]."""

    def step(side: Side, ctx: Ctx) -> None:
        answer = side.post(LIST, {"first": first}, tenant=_tenant(ctx, tenant))
        ctx.values["cursor"] = answer.data("runtimes")["pageInfo"]["endCursor"]

    return step


def _resolve(value: Any, ctx: Ctx) -> Any:
    """ "<ga>" -> the world's ID of role ga, "<runtime x>" -> runtime x's ID; others as given."""
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        inner = value[1:-1]
        if inner.startswith("runtime "):
            return ctx.runtimes[inner.removeprefix("runtime ")]
        if inner in ctx.world.ids:
            return ctx.world.ids[inner]
        if inner in ctx.values:
            return ctx.values[inner]
    if isinstance(value, dict):
        return {k: _resolve(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, ctx) for v in value]
    return value


# -- normalisation -------------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
# Go's time.MarshalJSON (inside `raw`): a fraction of a second, trailing zeros dropped.
_JSON_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z")
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{86}==")


def _text(value: str, ctx: Ctx) -> str:
    names = ctx.names()
    if value in names:
        return names[value]
    if value == ctx.connector_url:
        return "<connectorURL>"
    if _TIMESTAMP.fullmatch(value) and value != _GO_ZERO_TIME:
        return "<timestamp>"
    if _JSON_TIME.fullmatch(value):
        return "<timestamp with fraction>"
    return _UUID.sub(lambda m: names.get(m.group(0), "<uuid>"), value)


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except ValueError:
        return False
    return True


def _shape(value: Any, ctx: Ctx, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v, ctx, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v, ctx) for v in value]
    if not isinstance(value, str):
        return value
    if key == "token":
        return "<token>" if _TOKEN.fullmatch(value) else value
    if key in ("startCursor", "endCursor"):
        return "<cursor>" if value and _is_base64(value) else value
    if key == "raw":
        return {"raw JSON": _shape(json.loads(value), ctx)}
    if key == "rawEncoded":
        return {"base64 of": _shape(json.loads(base64.b64decode(value)), ctx)}
    return _text(value, ctx)


def _error(entry: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
    extensions = entry.get("extensions") or {}
    return {
        "keys": sorted(entry),
        "error_code": extensions.get("error_code"),
        "error": extensions.get("error"),
        "path": entry.get("path"),
        "message": _text(entry.get("message", ""), ctx),
    }


def normalised(answer: Answer, ctx: Ctx) -> dict[str, Any]:
    """The whole answer, IDs by role, other UUIDs and timestamps as placeholders."""
    if not isinstance(answer.body, dict):
        return {"status": answer.status, "text": answer.body}
    return {
        "status": answer.status,
        "keys": sorted(answer.body),
        "errors": [_error(e, ctx) for e in answer.body.get("errors") or []],
        "data": _shape(answer.body.get("data"), ctx),
    }


def status_only(answer: Answer, _ctx: Ctx) -> dict[str, Any]:
    return {"status": answer.status}


_PARSER_REASON = re.compile(r"(reason: input(:\d+:|: variable\.\w+) ).*\]$", re.DOTALL)


def parser_reason_cut(answer: Answer, ctx: Ctx) -> dict[str, Any]:
    """As `normalised`, but a parser's own wording after "input:<line>: " or
    "input: variable.<name> " is not compared."""
    result = normalised(answer, ctx)
    for error in result["errors"]:
        error["message"] = _PARSER_REASON.sub(r"\1…]", error["message"])
    return result


# -- what the notes say, pinned on both sides ------------------------------------------------

Check = Callable[[Answer, Ctx], None]


def codes(*expected: int, status: int = 200) -> Check:
    def check(answer: Answer, _ctx: Ctx) -> None:
        assert answer.status == status, answer
        found = [e["extensions"]["error_code"] for e in answer.body["errors"]]
        assert found == list(expected), answer

    return check


def message(pattern: str) -> Check:
    def check(answer: Answer, ctx: Ctx) -> None:
        [error] = answer.body["errors"]
        assert re.fullmatch(pattern, _text(error["message"], ctx)), error["message"]

    return check


def both(*checks: Check) -> Check:
    def check(answer: Answer, ctx: Ctx) -> None:
        for one in checks:
            one(answer, ctx)

    return check


INTERNAL = r"Internal Server Error \[errorID=<uuid>\]"


def internal_because(reason: str) -> str:
    return r"Internal Server Error \[errorID=<uuid>, reason: " + reason + r"\]"


def no_path(answer: Answer, _ctx: Ctx) -> None:
    """The request was refused as a whole, before any field ran."""
    assert all("path" not in e for e in answer.body["errors"]), answer


def labels_are(expected: dict[str, Any], field_name: str = "registerRuntime") -> Check:
    def check(answer: Answer, ctx: Ctx) -> None:
        assert answer.data(field_name)["labels"] == _resolve(expected, ctx), answer

    return check


def fresh_token(answer: Answer, ctx: Ctx) -> None:
    token = answer.data("requestOneTimeTokenForRuntime")
    assert len(token["token"]) == 88
    assert len(base64.urlsafe_b64decode(token["token"])) == 64
    assert token["used"] is False
    assert token["connectorURL"] == ctx.connector_url
    assert _TIMESTAMP.fullmatch(token["expiresAt"]), token
    expires = datetime.fromisoformat(token["expiresAt"])
    ahead = expires - datetime.now(UTC)
    assert timedelta(minutes=58) < ahead <= timedelta(minutes=60, seconds=1), ahead


def page(count: int, *, has_next: bool) -> Check:
    def check(answer: Answer, _ctx: Ctx) -> None:
        result = answer.data("runtimes")
        assert len(result["data"]) == count, answer
        assert result["pageInfo"]["hasNextPage"] is has_next
        assert (result["pageInfo"]["endCursor"] == "") is not has_next

    return check


# -- the cases -------------------------------------------------------------------------------

Variables = dict[str, Any] | Callable[[Ctx], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    id: str
    rows: tuple[str, ...]
    document: str
    variables: Variables = field(default_factory=dict)
    tenant: str | None = "ga"
    scopes: tuple[str, ...] = ALL_SCOPES
    setup: tuple[Step, ...] = ()
    extract: Callable[[Answer, Ctx], Any] = normalised
    check: Check | None = None
    bearer: str | None = None  # a bearer of our own instead of a valid token


def _reg(name: str, **fields: Any) -> dict[str, Any]:
    return {"in": {"name": name, **fields}}


MISSING = "00000000-0000-4000-8000-000000000001"  # a UUID no runtime has
KYMA_ID = "6f1e0c3a-9b7d-4e2f-8a15-3c4d5e6f7a8b"
# What the broker writes: compass-manager's labels plus its own (placeholders by role).
BROKER_LABELS: dict[str, Any] = {
    "director_connection_managed_by": "compass-broker",
    "kyma_runtime_id": KYMA_ID,
    "broker_instance_id": "instance-1",
    "gardenerClusterName": "shoot-abc",
    "global_subaccount_id": "<sa>",
    "global_account_id": "<ga>",
    "broker_plan_id": "plan-1",
    "broker_plan_name": "azure",
}


def broker_labels(ctx: Ctx) -> dict[str, Any]:
    labels: dict[str, Any] = _resolve(BROKER_LABELS, ctx)
    return labels


NOT_A_UUID = "not-a-uuid"

CASES: tuple[Case, ...] = (
    # -- the "Same:" list
    Case(
        "page-size-0",
        ("same-page-size",),
        LIST,
        {"first": 0},
        check=both(
            codes(22), message(r"Invalid data \[reason=page size must be between 1 and 200\]")
        ),
    ),
    Case("page-size-201", ("same-page-size",), LIST, {"first": 201}, check=codes(22)),
    Case(
        "page-size-200",
        ("same-page-size",),
        LIST,
        {"first": 200},
        setup=(register("only"),),
        check=page(1, has_next=False),
    ),
    Case(
        "name-blank",
        ("same-name",),
        REGISTER,
        _reg(""),
        check=message(r"Invalid data RuntimeRegisterInput \[name=cannot be blank\]"),
    ),
    Case("name-257", ("same-name",), REGISTER, _reg("a" * 257), check=codes(22)),
    Case("name-format", ("same-name",), REGISTER, _reg("has space/slash"), check=codes(22)),
    Case("name-compass-manager", ("same-name",), REGISTER, _reg("c-7d3a1b2-AbQxZr")),
    Case(
        "register-bad-label-key",
        ("same-label-rules", "messages"),
        REGISTER,
        _reg("x", labels={"bad-key": "v", "fine": "v"}),
        check=message(
            r"Invalid data RuntimeRegisterInput \[labels=bad-key: must be in a valid format\.\]"
        ),
    ),
    Case(
        "set-label-bad-key",
        ("same-label-rules",),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "bad-key", "value": "v"},
        setup=(register("rt"),),
        check=codes(22),
    ),
    Case(
        "set-label-blank-value",
        ("same-label-rules",),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k", "value": ""},
        setup=(register("rt"),),
        check=message(r"Invalid data LabelInput \[value=cannot be blank\]"),
    ),
    Case(
        "register-plain",
        ("same-normalized", "kyma-labels"),
        REGISTER,
        _reg("plain", labels={"broker_plan_name": "azure"}),
        check=labels_are(
            {
                "broker_plan_name": "azure",
                "isNormalized": "true",
                "runtimeType": "kyma",
                "region": "",
            }
        ),
    ),
    Case(
        "register-keeps-given-is-normalized",
        ("same-normalized",),
        REGISTER,
        _reg("given", labels={"isNormalized": "false"}),
    ),
    Case(
        "update-replaces-labels",
        ("same-update",),
        UPDATE,
        lambda c: {"id": c.runtimes["rt"], "in": {"name": "renamed", "labels": {"c": "3"}}},
        setup=(register("rt", labels={"a": "1", "global_subaccount_id": "<sa>"}),),
    ),
    Case(
        "names-not-unique",
        ("same-names-not-unique",),
        REGISTER,
        _reg("twin"),
        setup=(register("twin"),),
        # the new runtime's ID is a fresh UUID, not the first twin's
        check=lambda a, c: assert_differs(a.data("registerRuntime")["id"], c.runtimes["twin"]),
    ),
    Case("no-tenant", ("same-no-tenant",), LIST, {"first": 10}, tenant=None, check=codes(24)),
    Case(
        "missing-scope",
        ("same-scope",),
        REGISTER,
        _reg("x"),
        scopes=(READ_SCOPE,),
        check=both(
            codes(23),
            message(
                r"insufficient scopes provided \[actual=runtime:read; required=runtime:write\]"
            ),
        ),
    ),
    Case(
        "unregister-returns-id",
        ("same-unregister",),
        UNREGISTER,
        lambda c: {"id": c.runtimes["rt"]},
        setup=(register("rt"),),
    ),
    Case(
        "token-shape",
        ("same-token",),
        TOKEN,
        lambda c: {"id": c.runtimes["rt"]},
        setup=(register("rt"),),
        check=fresh_token,
    ),
    # -- the table
    Case(
        "register-in-subaccount",
        ("kyma-labels", "child-subaccount"),
        REGISTER,
        lambda c: _reg("in-sa", labels={"global_subaccount_id": c.world.ids["sa"]}),
        check=labels_are(
            {
                "global_subaccount_id": "<sa>",
                "isNormalized": "true",
                "runtimeType": "kyma",
                "region": REGION,
            }
        ),
    ),
    Case(
        "register-in-subaccount-without-region",
        ("kyma-labels",),
        REGISTER,
        lambda c: _reg("in-bare", labels={"global_subaccount_id": c.world.ids["sa_bare"]}),
    ),
    Case(
        "register-runtime-type-given",
        ("kyma-labels",),
        REGISTER,
        _reg("typed", labels={"runtimeType": "other", "region": "mine"}),
    ),
    Case(
        "set-runtime-type",
        ("kyma-labels",),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "runtimeType", "value": "x"},
        setup=(register("rt"),),
        check=codes(22),
    ),
    Case(
        "unknown-subaccount",
        ("unknown-subaccount",),
        REGISTER,
        lambda c: _reg("x", labels={"global_subaccount_id": c.world.ids["unknown_sa"]}),
        check=both(codes(20), message(r"Object not found \[object=tenant\]")),
    ),
    Case(
        "other-accounts-subaccount",
        ("not-a-child",),
        REGISTER,
        lambda c: _reg("x", labels={"global_subaccount_id": c.world.ids["other_sa"]}),
        check=codes(27),
    ),
    Case(
        "sibling-subaccount",
        ("not-a-child",),
        REGISTER,
        lambda c: _reg("x", labels={"global_subaccount_id": c.world.ids["sa_bare"]}),
        tenant="sa",
        check=codes(27),
    ),
    Case(
        "listed-from-the-subaccount",
        ("child-subaccount",),
        LIST,
        {"first": 10},
        tenant="sa",
        setup=(register("owned", labels={"global_subaccount_id": "<sa>"}),),
        check=page(1, has_next=False),
    ),
    Case(
        "listed-from-the-global-account",
        ("child-subaccount",),
        LIST,
        {"first": 10, "filter": [{"key": "global_subaccount_id"}]},
        setup=(register("owned", labels={"global_subaccount_id": "<sa>"}),),
        check=page(1, has_next=False),
    ),
    Case(
        "hidden-from-a-sibling",
        ("child-subaccount",),
        GET,
        lambda c: {"id": c.runtimes["owned"]},
        tenant="sa_bare",
        setup=(register("owned", labels={"global_subaccount_id": "<sa>"}),),
    ),
    Case(
        "token-for-missing-runtime",
        ("token-missing",),
        TOKEN,
        {"id": MISSING},
        check=both(
            codes(27),
            message(
                r"The operation is not allowed \[object=systemAuth; "
                r"reason=The referenced entity does not exists\]"
            ),
        ),
    ),
    Case(
        "token-for-unregistered-runtime",
        ("token-missing",),
        TOKEN,
        lambda c: {"id": c.runtimes["gone"]},
        setup=(register("gone"), unregister("gone")),
        check=codes(27),
    ),
    Case(
        "token-for-another-tenants-runtime",
        ("token-other-tenant",),
        TOKEN,
        lambda c: {"id": c.runtimes["theirs"]},
        setup=(register("theirs", tenant="other_ga"),),
        check=fresh_token,
    ),
    Case(
        "set-label-on-missing-runtime",
        ("set-label-missing",),
        SET_LABEL,
        {"runtimeID": MISSING, "key": "k", "value": "v"},
        check=both(
            codes(10),
            message(
                internal_because(r"input: setRuntimeLabel Runtime with ID <uuid> doesn't exist")
            ),
        ),
    ),
    Case(
        "delete-label-on-missing-runtime",
        ("set-label-missing",),
        DELETE_LABEL,
        {"runtimeID": MISSING, "key": "k"},
    ),
    Case(
        "runtime-with-non-uuid",
        ("code-10-inputs",),
        GET,
        {"id": NOT_A_UUID},
        check=both(codes(10), message(INTERNAL)),
    ),
    Case("unregister-non-uuid", ("code-10-inputs",), UNREGISTER, {"id": NOT_A_UUID}),
    Case("token-non-uuid", ("code-10-inputs",), TOKEN, {"id": NOT_A_UUID}, check=codes(10)),
    Case(
        "set-label-non-uuid",
        ("code-10-inputs",),
        SET_LABEL,
        {"runtimeID": NOT_A_UUID, "key": "k", "value": "v"},
        check=codes(10),
    ),
    Case(
        "cursor-not-base64",
        ("code-10-inputs",),
        LIST,
        {"first": 2, "after": "not a cursor"},
        check=codes(10),
    ),
    Case(
        "cursor-not-an-offset",
        ("code-10-inputs",),
        LIST,
        {"first": 2, "after": base64.b64encode(b"offset:2").decode()},
        check=codes(10),
    ),
    Case(
        "filter-query-not-json",
        ("code-10-inputs",),
        LIST,
        {"first": 2, "filter": [{"key": "k", "query": "not json"}]},
        check=both(codes(10), message(INTERNAL)),
    ),
    Case(
        "register-label-key-257",
        ("code-10-inputs",),
        REGISTER,
        _reg("x", labels={"k" * 257: "v"}),
        check=both(codes(10), message(INTERNAL)),
    ),
    Case(
        "set-label-key-257",
        ("code-10-inputs",),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k" * 257, "value": "v"},
        setup=(register("rt"),),
        check=codes(22),
    ),
    Case(
        "register-scenarios",
        ("scenarios",),
        REGISTER,
        _reg("x", labels={"scenarios": ["DEFAULT"]}),
        check=both(
            codes(10),
            message(
                internal_because(
                    "input: registerRuntime label with key scenarios cannot be set explicitly"
                )
            ),
        ),
    ),
    Case(
        "unknown-tenant",
        ("unknown-tenant",),
        LIST,
        {"first": 10},
        tenant="unknown",
        check=both(
            codes(25, status=400),
            message(r"Tenant not found \[externalTenant=<unknown>\]"),
            no_path,
        ),
    ),
    Case(
        "unknown-field",
        ("validation",),
        UNKNOWN_FIELD,
        {"id": MISSING},
        extract=parser_reason_cut,
        check=codes(10, status=422),
    ),
    Case(
        "null-for-a-required-variable",
        ("validation",),
        SET_LABEL,
        {"runtimeID": None, "key": "k", "value": "v"},
        extract=parser_reason_cut,
        check=codes(10, status=422),
    ),
    Case(
        "first-page",
        ("end-cursor",),
        LIST,
        {"first": 2},
        setup=(register("page-a"), register("page-b"), register("page-c")),
        check=page(2, has_next=True),
    ),
    Case(
        "last-page",
        ("end-cursor",),
        LIST,
        lambda c: {"first": 2, "after": c.values["cursor"]},
        setup=(register("page-a"), register("page-b"), register("page-c"), remember_cursor(2)),
        check=page(1, has_next=False),
    ),
    Case(
        "unregister-missing",
        ("messages",),
        UNREGISTER,
        {"id": MISSING},
        check=both(codes(20), message(r"Object not found \[object=runtime\]")),
    ),
    Case(
        "update-missing",
        ("messages",),
        UPDATE,
        {"id": MISSING, "in": {"name": "x"}},
        check=codes(20),
    ),
    # -- beyond the table: more of the class (how Director reports what it refuses)
    Case("runtime-missing", (), GET, {"id": MISSING}),
    Case(
        "runtime-labels-by-key",
        (),
        'query RuntimeLabel($id: ID!) { runtime(id: $id) { labels(key: "region") } }',
        lambda c: {"id": c.runtimes["rt"]},
        setup=(register("rt", labels={"global_subaccount_id": "<sa>"}),),
    ),
    Case(
        "register-everything",
        (),
        REGISTER,
        _reg(
            "full",
            description="d" * 2000,
            statusCondition="CONNECTED",
            applicationNamespace="mine",
            labels={"n": 1, "o": {"a": [1, 2]}, "l": ["x", "y"], "b": True},
        ),
    ),
    Case("description-2001", (), REGISTER, _reg("x", description="d" * 2001), check=codes(22)),
    Case(
        "subaccount-as-one-string-list",
        (),
        REGISTER,
        lambda c: _reg("listed", labels={"global_subaccount_id": [c.world.ids["sa"]]}),
    ),
    Case(
        "subaccount-as-two-strings",
        (),
        REGISTER,
        lambda c: _reg("two", labels={"global_subaccount_id": [c.world.ids["sa"], "x"]}),
        check=codes(10),
    ),
    Case("subaccount-as-number", (), REGISTER, _reg("num", labels={"global_subaccount_id": 5})),
    Case(
        "subaccount-is-the-caller",
        (),
        REGISTER,
        lambda c: _reg("self", labels={"global_subaccount_id": c.world.ids["ga"]}),
    ),
    Case(
        "subaccount-registers-in-itself",
        (),
        REGISTER,
        lambda c: _reg("self", labels={"global_subaccount_id": c.world.ids["sa"]}),
        tenant="sa",
    ),
    Case(
        "subaccount-names-its-parent",
        (),
        REGISTER,
        lambda c: _reg("up", labels={"global_subaccount_id": c.world.ids["ga"]}),
        tenant="sa",
        check=codes(27),
    ),
    Case(
        "registered-by-a-subaccount-seen-from-its-account",
        (),
        LIST,
        {"first": 10},
        setup=(register("by-sa", tenant="sa"),),
        check=page(1, has_next=False),
    ),
    Case(
        "update-from-the-account",
        (),
        UPDATE,
        lambda c: {"id": c.runtimes["owned"], "in": {"name": "new", "description": "d"}},
        setup=(register("owned", labels={"global_subaccount_id": "<sa>"}),),
    ),
    Case(
        "unregister-from-a-sibling",
        (),
        UNREGISTER,
        lambda c: {"id": c.runtimes["owned"]},
        tenant="sa_bare",
        setup=(register("owned", labels={"global_subaccount_id": "<sa>"}),),
        check=codes(20),
    ),
    Case(
        "update-scenarios",
        (),
        UPDATE,
        lambda c: {"id": c.runtimes["rt"], "in": {"name": "x", "labels": {"scenarios": ["A"]}}},
        setup=(register("rt"),),
        check=codes(10),
    ),
    Case(
        "update-label-key-257",
        (),
        UPDATE,
        lambda c: {"id": c.runtimes["rt"], "in": {"name": "x", "labels": {"k" * 257: "v"}}},
        setup=(register("rt"),),
        check=codes(10),
    ),
    Case(
        "set-label-object",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "obj", "value": {"a": [1, "b"]}},
        setup=(register("rt"),),
    ),
    Case(
        "set-label-scenarios",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "scenarios", "value": ["A"]},
        setup=(register("rt"),),
        check=codes(10),
    ),
    Case(
        "set-label-zero",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k", "value": 0},
        setup=(register("rt"),),
    ),
    Case(
        "set-label-false",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k", "value": False},
        setup=(register("rt"),),
    ),
    Case(
        "set-label-empty-list",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k", "value": []},
        setup=(register("rt"),),
    ),
    Case(
        "set-label-empty-object",
        (),
        SET_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "k", "value": {}},
        setup=(register("rt"),),
    ),
    Case(
        "delete-missing-label",
        (),
        DELETE_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "nope"},
        setup=(register("rt"),),
        check=codes(20),
    ),
    Case(
        "delete-region-label",
        (),
        DELETE_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "region"},
        setup=(register("rt"),),
    ),
    Case(
        "delete-runtime-type-label",
        (),
        DELETE_LABEL,
        lambda c: {"runtimeID": c.runtimes["rt"], "key": "runtimeType"},
        setup=(register("rt"),),
        check=codes(22),
    ),
    Case("delete-label-non-uuid", (), DELETE_LABEL, {"runtimeID": NOT_A_UUID, "key": "k"}),
    Case(
        "update-non-uuid",
        (),
        UPDATE,
        {"id": NOT_A_UUID, "in": {"name": "x"}},
        check=codes(10),
    ),
    Case(
        "uppercase-id",
        (),
        GET,
        lambda c: {"id": c.runtimes["rt"].upper()},
        setup=(register("rt"),),
    ),
    Case(
        "cursor-negative",
        (),
        LIST,
        {"first": 2, "after": base64.b64encode(b"DpKtJ4j9jDq-2").decode()},
        check=codes(22),
    ),
    Case(
        "cursor-beyond-the-end",
        (),
        LIST,
        {"first": 2, "after": base64.b64encode(b"DpKtJ4j9jDq10").decode()},
        setup=(register("rt"),),
        check=page(0, has_next=False),
    ),
    Case("first-omitted", (), LIST, {}, setup=(register("rt"),)),
    Case(
        "filters",
        (),
        LIST,
        {
            "first": 10,
            "filter": [
                {"key": "l", "query": '"x"'},
                {"key": "o", "query": '{"a": [2]}'},
            ],
        },
        setup=(
            register("match", labels={"l": ["x", "y"], "o": {"a": [1, 2]}}),
            register("miss", labels={"l": ["y"], "o": {"a": [1, 2]}}),
        ),
        check=page(1, has_next=False),
    ),
    Case(
        "filter-by-subaccount",
        (),
        LIST,
        lambda c: {
            "first": 10,
            "filter": [{"key": "global_subaccount_id", "query": json.dumps(c.world.ids["sa"])}],
        },
        setup=(
            register("in-sa", labels={"global_subaccount_id": "<sa>"}),
            register("in-bare", labels={"global_subaccount_id": "<sa_bare>"}),
        ),
        check=page(1, has_next=False),
    ),
    Case(
        "filter-by-runtime-type-json",
        (),
        LIST,
        {"first": 10, "filter": [{"key": "runtimeType", "query": '"kyma"'}]},
        setup=(register("rt"),),
    ),
    Case(
        "filter-by-runtime-type-json-path",
        (),
        LIST,
        {"first": 10, "filter": [{"key": "runtimeType", "query": '$[*] ? (@ == "kyma")'}]},
        setup=(register("rt"),),
    ),
    Case(
        "two-fields-one-fails",
        (),
        "mutation Two($ok: RuntimeRegisterInput!, $bad: RuntimeRegisterInput!) "
        "{ a: registerRuntime(in: $ok) { name } b: registerRuntime(in: $bad) { name } }",
        {"ok": {"name": "fine"}, "bad": {"name": "not fine"}},
    ),
    Case(
        "query-without-read-scope",
        (),
        LIST,
        {"first": 1},
        scopes=(WRITE_SCOPE,),
        check=codes(23),
    ),
    Case(
        "syntax-error",
        (),
        "query { runtimes(first: 1) {",
        extract=parser_reason_cut,
        check=codes(10, status=422),
    ),
    Case("labels-a-list", (), REGISTER, {"in": {"name": "x", "labels": ["a"]}}),
    Case("labels-a-string", (), REGISTER, {"in": {"name": "x", "labels": "a"}}),
    Case("labels-a-number", (), REGISTER, {"in": {"name": "x", "labels": 1}}),
    Case(
        "labels-a-list-on-update",
        (),
        UPDATE,
        lambda c: {"id": c.runtimes["rt"], "in": {"name": "x", "labels": [1]}},
        setup=(register("rt"),),
    ),
    Case(
        "filter-by-scenarios",
        (),
        LIST,
        {"first": 10, "filter": [{"key": "scenarios", "query": '$[*] ? (@ == "DEFAULT")'}]},
        setup=(register("rt"),),
    ),
    Case(
        "filter-by-scenarios-plain-json",
        (),
        LIST,
        {"first": 10, "filter": [{"key": "scenarios", "query": '"DEFAULT"'}]},
        setup=(register("rt"),),
    ),
    Case(
        "filter-by-runtime-type-two-values",
        (),
        LIST,
        {
            "first": 10,
            "filter": [{"key": "runtimeType", "query": '$[*] ? (@ == "other" || @ == "kyma")'}],
        },
        setup=(register("rt"),),
    ),
    Case(
        "filter-by-runtime-type-key-only",
        (),
        LIST,
        {"first": 10, "filter": [{"key": "runtimeType"}]},
        setup=(register("rt"),),
    ),
    # -- the broker's own documents, through a runtime's life and after it
    Case(
        "broker-register",
        (),
        broker.REGISTER_RUNTIME,
        lambda c: {"in": {"name": "shoot-abc", "labels": broker_labels(c)}},
    ),
    Case(
        "broker-look-up",
        (),
        broker.RUNTIMES_BY_LABEL,
        {"first": 200, "filter": [{"key": "kyma_runtime_id", "query": json.dumps(KYMA_ID)}]},
        setup=(register("shoot-abc", labels=BROKER_LABELS),),
        check=page(1, has_next=False),
    ),
    Case(
        "broker-runtime-by-id",
        (),
        broker.RUNTIME_BY_ID,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS),),
    ),
    Case(
        "broker-token",
        (),
        broker.REQUEST_OTT,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS),),
        check=fresh_token,
    ),
    Case(
        "broker-set-label",
        (),
        broker.SET_RUNTIME_LABEL,
        lambda c: {"runtimeID": c.runtimes["shoot-abc"], "key": "broker_plan_name", "value": "aws"},
        setup=(register("shoot-abc", labels=BROKER_LABELS),),
    ),
    Case(
        "broker-unregister",
        (),
        broker.UNREGISTER_RUNTIME,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS),),
    ),
    Case(
        "broker-runtime-by-id-after-unregister",
        (),
        broker.RUNTIME_BY_ID,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS), unregister("shoot-abc")),
    ),
    Case(
        "broker-look-up-after-unregister",
        (),
        broker.RUNTIMES_BY_LABEL,
        {"first": 200, "filter": [{"key": "kyma_runtime_id", "query": json.dumps(KYMA_ID)}]},
        setup=(register("shoot-abc", labels=BROKER_LABELS), unregister("shoot-abc")),
        check=page(0, has_next=False),
    ),
    Case(
        "broker-token-after-unregister",
        (),
        broker.REQUEST_OTT,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS), unregister("shoot-abc")),
        check=codes(27),
    ),
    Case(
        "broker-set-label-after-unregister",
        (),
        broker.SET_RUNTIME_LABEL,
        lambda c: {"runtimeID": c.runtimes["shoot-abc"], "key": "broker_plan_name", "value": "x"},
        setup=(register("shoot-abc", labels=BROKER_LABELS), unregister("shoot-abc")),
        check=codes(10),
    ),
    Case(
        "broker-unregister-after-unregister",
        (),
        broker.UNREGISTER_RUNTIME,
        lambda c: {"id": c.runtimes["shoot-abc"]},
        setup=(register("shoot-abc", labels=BROKER_LABELS), unregister("shoot-abc")),
        check=codes(20),
    ),
    # -- where a gateway answers, and the fault both have
    Case(
        "unauthorized",
        (),
        LIST,
        {"first": 1},
        bearer="not-a-token-anyone-issued",
        extract=status_only,
    ),
    Case(
        "lost-register-answer",
        (),
        LIST,
        {"first": 10},
        setup=(register("lost", lost=True),),
        check=page(1, has_next=False),
    ),
)


def assert_differs(left: object, right: object) -> None:
    assert left != right, (left, right)


WORLDS: dict[str, World] = {case.id: World.new() for case in CASES}


def test_every_row_is_covered() -> None:
    covered = {row for case in CASES for row in case.rows}
    assert covered == set(ROWS), set(ROWS) ^ covered
    assert len({case.id for case in CASES}) == len(CASES)


# -- the two sides as fixtures ---------------------------------------------------------------


class _SimFaults:
    def __init__(self, sim: CompassSimulator) -> None:
        self._sim = sim

    def lose_next(self, operation: str) -> None:
        self._sim.update_faults(lost_responses={operation: 1})

    def clear(self) -> None:
        self._sim.clear_faults()


class _RealFaults:
    def __init__(self, real: Any) -> None:
        self._real = real

    def lose_next(self, operation: str) -> None:
        self._real.lose_answers(operation, count=1)

    def clear(self) -> None:
        self._real.clear_faults()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sim_side(http: httpx.Client) -> Iterator[Side]:
    accounts: dict[str, GlobalAccount] = {}
    for world in WORLDS.values():
        accounts.update(world.accounts())
    config = SimConfig(client_id="contract", client_secret="contract-secret", accounts=accounts)
    with CompassSimulator(config).running() as sim:
        yield Side(
            name="simulator",
            director_url=sim.director_url,
            token_url=sim.token_url,
            client_id="contract",
            client_secret="contract-secret",
            connector_url=sim.connector_url,
            faults=_SimFaults(sim),
            http=http,
        )


@pytest.fixture(scope="module")
def real_side(real_compass: Any, http: httpx.Client) -> Side:
    for world in WORLDS.values():
        for account_id, account in world.accounts().items():
            real_compass.add_global_account(account_id)
            for subaccount_id, subaccount in account.subaccounts.items():
                real_compass.add_subaccount(
                    subaccount_id, parent=account_id, region=subaccount.region
                )
    return Side(
        name="real Director",
        director_url=real_compass.director_url,
        token_url=real_compass.token_url,
        client_id=real_compass.client_id,
        client_secret=real_compass.client_secret,
        connector_url=real_compass.connector_url,
        faults=_RealFaults(real_compass),
        http=http,
    )


def _run(case: Case, side: Side) -> tuple[Answer, Ctx]:
    ctx = Ctx(world=WORLDS[case.id], connector_url=side.connector_url)
    try:
        for step in case.setup:
            step(side, ctx)
        variables = case.variables(ctx) if callable(case.variables) else case.variables
        answer = side.post(
            case.document,
            variables,
            tenant=_tenant(ctx, case.tenant),
            scopes=case.scopes,
            bearer=case.bearer,
        )
    finally:
        side.faults.clear()
    return answer, ctx


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_simulator_answers_as_the_real_director(
    case: Case, real_side: Side, sim_side: Side
) -> None:
    real_answer, real_ctx = _run(case, real_side)
    sim_answer, sim_ctx = _run(case, sim_side)
    if case.check is not None:
        case.check(real_answer, real_ctx)  # the notes still describe the real Director
    real = case.extract(real_answer, real_ctx)
    sim = case.extract(sim_answer, sim_ctx)
    assert sim == real, (
        f"{case.id}: the simulator answers\n{json.dumps(sim, indent=1)}\n"
        f"the real Director\n{json.dumps(real, indent=1)}"
    )
    if case.check is not None:
        case.check(sim_answer, sim_ctx)
