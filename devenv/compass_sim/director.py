"""Director: the runtime part of Compass's GraphQL API, answering as the real Director does.

The real Director is the oracle: `tests/integration/real_director/test_contract.py`
sends the same requests to both and compares the answers.

Request checks, in order:
1. Bearer token (HTTP level): missing, unknown or expired -> HTTP 401 with one
   error entry, code 26 (the real gateway rejects such requests before Director).
2. Tenant (HTTP level): a `Tenant` Director does not know -> HTTP 400, one error
   entry, code 25, no `path` (Director's authenticator refuses the whole request).
3. Document: parse / validation / variable errors -> HTTP 422, each entry code 10
   (gqlgen hands them to Director's error presenter, which knows them as no typed error).
4. Per root field: scope (`runtime:read` for queries, `runtime:write` for mutations)
   -> 23; `Tenant` header missing -> 24; then injected faults; then the resolver.

Faults of Director's database (`faults.py`), answered with HTTP 200 as the real one:
- `database_down`: before the resolver, in turn per operation: code 10
  `Internal Server Error [errorID=…]`; code 10 with the reason `input: <key> driver:
  bad connection`; for registerRuntime and setRuntimeLabel code 26 `Unauthorized
  [reason=Tenant <internal ID> does not have access to the parent of the currently
  created runtimeLabel: while checking for tenant access: Internal Server Error:
  Unexpected error while executing SQL query]`. Nothing is written.
- `commit_then_error`: after the resolver wrote, code 10 with the reason `input: <key>
  while committing transaction: driver: bad connection` (requestOneTimeTokenForRuntime
  wraps it twice, as its resolver does), `data.<key>` null.
- `field_error_after_commit`: the `labels` field of the answered Runtime is null, with
  code 10 `... reason: input: <key>.labels while committing transaction: ...` at
  `path [<key>, "labels"]` (`runtimes`: `[<key>, "data", <n>, "labels"]`); the rest
  of the answer (id, name) stands. Schema: `labels` is nullable, as in Director's.

Semantics (as the real Director):
- A runtime is owned by the caller's tenant, or by the subaccount its
  `global_subaccount_id` label names (unknown -> 20 `object=tenant`; not the caller nor
  a child of it -> 27), and is visible to its owner and the owner's parents.
- Registered by an Integration System (`SimConfig.consumer_type`), a runtime gets labels
  `runtimeType: "kyma"` and `region` (the owning subaccount's, else "") and
  applicationNamespace "sap.kyma". Every register/update adds `isNormalized: "true"`
  unless given. `runtimeType` is immutable: dropped from inputs, kept by updates,
  refused by setRuntimeLabel. Update replaces name, status and all other labels, and
  keeps description and applicationNamespace unless given.
- IDs must be UUIDs (else code 10: Postgres refuses the text). A missing runtime is
  `null` for `runtime(id)`, 20 `Object not found [object=runtime]` for update and
  unregister, and 10 `... reason: Runtime with ID <id> doesn't exist` for the label
  mutations. The `scenarios` label is 10 `cannot be set explicitly`; a label key
  longer than its 256-character column is 10 on register and update (setRuntimeLabel
  checks the length first: 22).
- `runtimes`: filters ANDed, JSON containment (a query that is not JSON: 10); `first`
  in 1..max page size (22 otherwise); ordered by name; `endCursor` is an opaque base64
  offset while there is a next page, "" on the last one (a cursor that does not decode:
  10; a negative offset: 22); `totalCount` counts all matches.
- `requestOneTimeTokenForRuntime` checks no ownership: a runtime of any tenant gets a
  token; a missing one is 27 (the token's row refers to no runtime). A token is URL-safe
  base64 of 64 random bytes for Connector, single use, bound to the runtime and the
  caller's tenant, expiring after the configured TTL; `usedAt` of an unused token is
  Go's zero time. Earlier tokens stay valid until used or expired.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from graphql import GraphQLResolveInfo, GraphQLSchema

from .calls import Call
from .config import ConsumerType, SimConfig
from .errors import BAD_CONNECTION, COMMIT_FAILED, DirectorError, ErrorCode
from .faults import DatabaseAnswer
from .graphql_http import GraphQLEndpoint, ParsedRequest, Response, load_schema
from .labels import (
    description_problem,
    is_blank,
    json_path_values,
    label_key_problem,
    parse_filters,
    runtime_name_problem,
)
from .oauth import BearerError, OAuthServer, hash_token
from .operations import DIRECTOR_MUTATIONS, DIRECTOR_QUERIES, required_scope
from .store import ConnectorTokenRecord, RuntimeRecord, RuntimeStatusCondition, Store, TokenKind
from .tenants import Tenants, internal_tenant_id

__all__ = ["Director", "DirectorContext", "new_connector_token", "serialize_timestamp"]

NORMALIZED_LABEL = "isNormalized"
SUBACCOUNT_LABEL = "global_subaccount_id"
SCENARIOS_LABEL = "scenarios"
RUNTIME_TYPE_LABEL = "runtimeType"
REGION_LABEL = "region"
KYMA_RUNTIME_TYPE = "kyma"
KYMA_APPLICATION_NAMESPACE = "sap.kyma"
# Director's default patterns; Go's regexp.MatchString searches, it does not anchor.
_IMMUTABLE_LABEL = re.compile(r"^xsappnameCMPClone$|^runtimeType$|^CMPSaaSAppName$")
_PROTECTED_LABEL = re.compile(r".*_defaultEventing")
# Width of the label key column: a longer key fails in the database, not in validation.
_LABEL_KEY_COLUMN = 256
_APPLICATION_NAMESPACE_LIMIT = 256
# Go's zero time.Time, which Director returns as `usedAt` of a token never used.
_GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
# The prefix Director's offset cursors carry inside their base64.
_CURSOR_PREFIX = "DpKtJ4j9jDq"
_VARIABLE_ERROR = re.compile(r"Variable '\$(\w+)'")
_SCENARIOS_SET = f"label with key {SCENARIOS_LABEL} cannot be set explicitly"


@dataclass
class DirectorContext:
    tenant: str | None
    scopes: frozenset[str]
    call: Call


def serialize_timestamp(value: datetime) -> str:
    # isoformat, not strftime: strftime writes year 1 (Go's zero time) as "1".
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def _go_json_time(value: datetime) -> str:
    """Go's time.MarshalJSON: RFC 3339 with the fraction's trailing zeros dropped."""
    text = value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    return text.rstrip("0").rstrip(".") + "Z"


def new_connector_token() -> str:
    """URL-safe base64 of 64 random bytes, as Compass generates its tokens."""
    return base64.urlsafe_b64encode(secrets.token_bytes(64)).decode()


def _parse_labels(value: Any) -> Any:
    # gqlgen unmarshals arguments inside the field, so a `Labels` that is no object fails
    # that field with code 10, not the whole document: `_checked_input` refuses it.
    return value


# Go's names for what encoding/json (with UseNumber) makes of a JSON value.
_GO_TYPES: dict[type, str] = {
    list: "[]interface {}",
    str: "string",
    bool: "bool",
    int: "json.Number",
    float: "json.Number",
}


def _set_scalar(
    schema: GraphQLSchema,
    name: str,
    *,
    output: Callable[[Any], Any] | None = None,
    input_: Callable[[Any], Any] | None = None,
) -> None:
    """Give an SDL scalar its coercion (graphql-core 3.2 and 3.3 attribute names).

    Literals need no function of their own: by default they are turned into plain
    values and passed to the input coercion.
    """
    scalar = schema.type_map[name]
    if output is not None:
        for attribute in ("serialize", "coerce_output_value"):
            setattr(scalar, attribute, output)
    if input_ is not None:
        for attribute in ("parse_value", "coerce_input_value"):
            setattr(scalar, attribute, input_)


def configure_scalars(schema: GraphQLSchema) -> None:
    """Give the SDL's custom scalars their coercion rules."""
    _set_scalar(schema, "Labels", input_=_parse_labels)
    _set_scalar(schema, "Timestamp", output=serialize_timestamp)


def _encode_cursor(offset: int) -> str:
    return base64.b64encode(f"{_CURSOR_PREFIX}{offset}".encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    failed = "while decoding page cursor: cursor is not correct"
    try:
        text = base64.b64decode(cursor, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise DirectorError.internal(
            f"{failed}: illegal base64 data at input byte {_first_bad_base64_byte(cursor)}"
        ) from None
    number = text.removeprefix(_CURSOR_PREFIX)
    # strconv.Atoi: an optional sign and ASCII digits, nothing else.
    if not re.fullmatch(r"[+-]?[0-9]+", number):
        raise DirectorError.internal(f'{failed}: strconv.Atoi: parsing "{number}": invalid syntax')
    offset = int(number)
    if offset < 0:
        raise DirectorError.invalid("cursor is not correct")
    return offset


def _first_bad_base64_byte(text: str) -> int:
    """Where Go's decoder stops: the first byte outside the alphabet (padding errors are
    placed at the end here, an approximation no client depends on)."""
    for index, char in enumerate(text):
        if not (char.isascii() and (char.isalnum() or char in "+/=")):
            return index
    return len(text)


def _uuid(value: str) -> str:
    """The canonical form of an ID, as Postgres reads it; other text fails in the database."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise DirectorError.internal() from None


def _is_modifiable(key: str) -> bool:
    return not (_PROTECTED_LABEL.search(key) or _IMMUTABLE_LABEL.search(key))


def _subaccount_of(labels: dict[str, Any]) -> str | None:
    """The `global_subaccount_id` label as Director reads it: a string or a one-string list."""
    if SUBACCOUNT_LABEL not in labels:
        return None
    value = labels[SUBACCOUNT_LABEL]
    failed = f"while converting {SUBACCOUNT_LABEL} label"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) != 1:
            raise DirectorError.internal(f"{failed}: expected single value for label")
        return str(value[0])
    if isinstance(value, str) and value:
        return value
    raise DirectorError.internal(f"{failed}: cannot cast label value: expected []string or string")


def _invalid_labels(labels: dict[str, Any]) -> str | None:
    """ozzo-validation's text for the keys of a `Labels` input that break the key rule."""
    problems = []
    for key in sorted(labels):
        if problem := label_key_problem(key, limit_length=False):
            problems.append(f"{key}: {problem}")
    return "; ".join(problems) + "." if problems else None


def runtime_to_graphql(record: RuntimeRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "description": record.description,
        "labels": record.labels,
        "status": {
            "condition": record.status_condition.value,
            "timestamp": record.status_timestamp,
        },
        "metadata": {"creationTimestamp": record.creation_timestamp},
        "applicationNamespace": record.application_namespace,
    }


def _gqlgen_path(info: GraphQLResolveInfo) -> str:
    """A field's path as gqlgen writes it into an error's text: `a.b[0].c`."""
    text = ""
    for part in info.path.as_list():
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _runtime_labels(obj: dict[str, Any], info: GraphQLResolveInfo, key: str | None = None) -> Any:
    context: DirectorContext = info.context
    if context.call.labels_fail(str(info.path.as_list()[0])):
        # Director's Labels resolver commits a transaction of its own (a read), after the
        # root field's; a failed commit is a plain error, shown with the field's path.
        raise DirectorError.internal(f"input: {_gqlgen_path(info)} {COMMIT_FAILED}")
    labels: dict[str, Any] = obj["labels"]
    if key is None:
        return labels
    return {key: labels[key]} if key in labels else {}


class Director:
    def __init__(
        self,
        *,
        config: SimConfig,
        store: Store,
        oauth: OAuthServer,
        clock: Callable[[], float],
        connector_url: Callable[[], str],
    ) -> None:
        self._config = config
        self._store = store
        self._oauth = oauth
        self._clock = clock
        self._connector_url = connector_url
        self.tenants = Tenants(config.accounts, store)
        schema = load_schema("director.graphql")
        configure_scalars(schema)
        self._bind(schema)
        self.endpoint = GraphQLEndpoint(schema)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    # -- HTTP --------------------------------------------------------------------

    def handle(
        self,
        parsed: ParsedRequest,
        *,
        authorization: str | None,
        tenant: str | None,
        call: Call,
    ) -> Response:
        try:
            token = self._oauth.check_bearer(authorization)
        except BearerError as exc:
            error = DirectorError(ErrorCode.UNAUTHORIZED, reason=str(exc))
            return Response(
                401,
                {"errors": [{"message": str(error), "extensions": error.extensions()}]},
                {f.key: [int(ErrorCode.UNAUTHORIZED)] for f in parsed.fields},
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        if tenant and not self.tenants.knows(tenant):
            return _whole_request_error(
                400, DirectorError(ErrorCode.TENANT_NOT_FOUND, externalTenant=tenant), parsed
            )
        if parsed.rejection is not None:
            return _presented(parsed.rejection, parsed)
        context = DirectorContext(tenant=tenant or None, scopes=token.scopes, call=call)
        response = self.endpoint.execute(parsed, context)
        if response.status == 422:
            return _presented(response, parsed)
        # Director's presenter builds each entry anew from message, path and extensions.
        for entry in (response.body or {}).get("errors", []):
            entry.pop("locations", None)
        return response

    # -- resolver plumbing ----------------------------------------------------------

    def _bind(self, schema: GraphQLSchema) -> None:
        resolvers: dict[str, Callable[..., Any]] = {
            "runtimes": self._runtimes,
            "runtime": self._runtime,
            "registerRuntime": self._register,
            "updateRuntime": self._update,
            "unregisterRuntime": self._unregister,
            "requestOneTimeTokenForRuntime": self._request_token,
            "setRuntimeLabel": self._set_label,
            "deleteRuntimeLabel": self._delete_label,
        }
        assert schema.query_type is not None
        assert schema.mutation_type is not None
        for name, resolver in resolvers.items():
            root = schema.query_type if name in DIRECTOR_QUERIES else schema.mutation_type
            assert name in DIRECTOR_QUERIES | DIRECTOR_MUTATIONS
            root.fields[name].resolve = self._guard(name, resolver)
        runtime_type = schema.type_map["Runtime"]
        runtime_type.fields["labels"].resolve = _runtime_labels  # type: ignore[attr-defined]

    def _guard(self, operation: str, resolver: Callable[..., Any]) -> Callable[..., Any]:
        scope = required_scope(operation)

        def resolve(_root: Any, info: GraphQLResolveInfo, **arguments: Any) -> Any:
            context: DirectorContext = info.context
            if scope not in context.scopes:
                raise DirectorError(
                    ErrorCode.INSUFFICIENT_SCOPES,
                    required=scope,
                    actual=";".join(sorted(context.scopes)),
                )
            if not context.tenant:
                raise DirectorError(ErrorCode.TENANT_REQUIRED)
            key = str(info.path.key)
            answer = context.call.database_answer(operation, key)
            if answer is not None:
                raise _database_error(answer, context.tenant, key)
            context.call.enter(operation, key)
            try:
                result = resolver(context.tenant, **arguments)
            except DirectorError as exc:
                raise exc.located(key) from None
            if context.call.commit_fails(operation, key):
                # Written, then the commit's answer was lost: an untyped error.
                reason = _COMMIT_REASONS.get(operation, COMMIT_FAILED)
                raise DirectorError.internal(f"input: {key} {reason}")
            context.call.done(operation)
            return result

        return resolve

    def _visible(self, tenant: str, runtime_id: str) -> RuntimeRecord | None:
        return self._store.get_runtime(tenant, _uuid(runtime_id))

    def _existing(self, tenant: str, runtime_id: str) -> RuntimeRecord:
        record = self._visible(tenant, runtime_id)
        if record is None:
            raise DirectorError.not_found("runtime")
        return record

    def _labelled(self, tenant: str, runtime_id: str) -> RuntimeRecord:
        """The runtime behind a label mutation: its absence is a plain error, so code 10."""
        record = self._visible(tenant, runtime_id)
        if record is None:
            raise DirectorError.internal(f"Runtime with ID {runtime_id} doesn't exist")
        return record

    def _checked_input(self, type_name: str, data: dict[str, Any]) -> dict[str, Any]:
        """The input's validation (22), as Director's `@validate` directive runs it."""
        raw_labels = data.get("labels")
        if raw_labels is not None and not isinstance(raw_labels, dict):
            go_type = _GO_TYPES.get(type(raw_labels), type(raw_labels).__name__)
            raise DirectorError.internal(
                f"unexpected Labels type: {go_type}, should be map[string]interface{{}}",
                below=".in.labels",
            )
        problems: dict[str, str] = {}
        if problem := runtime_name_problem(data["name"]):
            problems["name"] = problem
        if problem := description_problem(data.get("description")):
            problems["description"] = problem
        labels: dict[str, Any] = dict(data.get("labels") or {})
        if problem := _invalid_labels(labels):
            problems["labels"] = problem
        namespace = data.get("applicationNamespace")
        if namespace is not None and len(namespace) > _APPLICATION_NAMESPACE_LIMIT:
            problems["applicationNamespace"] = (
                f"the length must be no more than {_APPLICATION_NAMESPACE_LIMIT}"
            )
        if problems:
            raise DirectorError.invalid_fields(type_name, problems)
        condition = data.get("statusCondition") or RuntimeStatusCondition.INITIAL.value
        return {
            "name": data["name"],
            "description": data.get("description"),
            "labels": labels,
            "status_condition": RuntimeStatusCondition(condition),
            "application_namespace": namespace,
        }

    def _stored_labels(self, labels: dict[str, Any]) -> dict[str, Any]:
        """Given labels as Director writes them: isNormalized added, unmodifiable ones dropped."""
        if self._config.add_normalized_label and labels.get(NORMALIZED_LABEL) is None:
            labels = {**labels, NORMALIZED_LABEL: "true"}
        return {key: value for key, value in labels.items() if _is_modifiable(key)}

    # -- queries ------------------------------------------------------------------

    def _runtimes(
        self,
        tenant: str,
        filter: list[dict[str, Any]] | None = None,
        first: int | None = None,
        after: str | None = None,
    ) -> dict[str, Any]:
        if first is None:
            raise DirectorError.invalid("missing required parameter 'first'")
        limit = self._config.max_page_size
        if not 1 <= first <= limit:
            raise DirectorError.invalid(f"page size must be between 1 and {limit}")
        scenarios = [f for f in filter or () if f["key"] == SCENARIOS_LABEL]
        if scenarios:
            # Director looks these up among formations, before the cursor is read; the
            # simulator has none, so nothing matches.
            try:
                for scenario_filter in scenarios:
                    json_path_values(scenario_filter.get("query") or "")
            except ValueError:
                raise DirectorError.internal() from None
            page_info = {"startCursor": after or "", "endCursor": "", "hasNextPage": False}
            return {"data": [], "totalCount": 0, "pageInfo": page_info}
        offset = _decode_cursor(after)
        try:
            filters = parse_filters(filter)
        except ValueError:
            # Postgres refuses a query that is no JSON; Director's path translation one
            # that is no path.
            raise DirectorError.internal() from None
        items, total = self._store.list_runtimes(tenant, filters, offset=offset, limit=first)
        has_next = total > offset + len(items)
        return {
            "data": [runtime_to_graphql(r) for r in items],
            "totalCount": total,
            "pageInfo": {
                "startCursor": after or "",
                "endCursor": _encode_cursor(offset + first) if has_next else "",
                "hasNextPage": has_next,
            },
        }

    def _runtime(self, tenant: str, id: str) -> dict[str, Any] | None:
        record = self._visible(tenant, id)
        return runtime_to_graphql(record) if record is not None else None

    # -- mutations ------------------------------------------------------------------

    def _register(self, tenant: str, **arguments: Any) -> dict[str, Any]:
        fields = self._checked_input("RuntimeRegisterInput", arguments["in"])
        given: dict[str, Any] = fields.pop("labels")
        ownership = self.tenants.owner_for(tenant, _subaccount_of(given))
        if SCENARIOS_LABEL in given:
            raise DirectorError.internal(_SCENARIOS_SET)
        labels = self._stored_labels(given)
        if self._config.consumer_type is ConsumerType.INTEGRATION_SYSTEM:
            labels[RUNTIME_TYPE_LABEL] = KYMA_RUNTIME_TYPE
            labels[REGION_LABEL] = ownership.region
            fields["application_namespace"] = KYMA_APPLICATION_NAMESPACE
        _check_key_column(labels)
        record = self._store.create_runtime(
            ownership.owner,
            now=self._now(),
            parents=ownership.parents,
            labels=labels,
            **fields,
        )
        return runtime_to_graphql(record)

    def _update(self, tenant: str, id: str, **arguments: Any) -> dict[str, Any]:
        fields = self._checked_input("RuntimeUpdateInput", arguments["in"])
        given: dict[str, Any] = fields.pop("labels")
        current = self._existing(tenant, id)
        if SCENARIOS_LABEL in given:
            raise DirectorError.internal(_SCENARIOS_SET)
        kept = {k: v for k, v in current.labels.items() if not _is_modifiable(k)}
        labels = {**kept, **self._stored_labels(given)}
        _check_key_column(labels)
        if fields["description"] is None:
            fields["description"] = current.description
        if fields["application_namespace"] is None:
            fields["application_namespace"] = current.application_namespace
        updated = current.model_copy(
            update={**fields, "labels": labels, "status_timestamp": self._now()}
        )
        return runtime_to_graphql(self._store.replace_runtime(updated))

    def _unregister(self, tenant: str, id: str) -> dict[str, Any]:
        record = self._store.delete_runtime(tenant, self._existing(tenant, id).id)
        if record is None:
            raise DirectorError.not_found("runtime")
        return runtime_to_graphql(record)

    def _request_token(
        self,
        tenant: str,
        id: str,
        systemAuthID: str | None = None,
    ) -> dict[str, Any]:
        runtime_id = _uuid(id)
        if self._store.find_runtime(runtime_id) is None:
            raise DirectorError.not_allowed(
                "The referenced entity does not exists", object_type="systemAuth"
            )
        token = new_connector_token()
        now = self._now()
        expires_at = now + timedelta(seconds=self._config.ott_ttl_seconds)
        self._store.add_token(
            ConnectorTokenRecord(
                token_hash=hash_token(token),
                kind=TokenKind.ONE_TIME,
                runtime_id=runtime_id,
                tenant=tenant,
                created_at=now,
                expires_at=expires_at,
                # Director keeps each one-time token in a SystemAuth of its own.
                system_auth_id=str(uuid.uuid4()),
            )
        )
        connector_url = self._connector_url()
        # Go's json.Marshal of the token object: compact, in the struct's field order.
        raw = json.dumps(
            {
                "token": token,
                "connectorURL": connector_url,
                "used": False,
                "expiresAt": _go_json_time(expires_at),
                "createdAt": _go_json_time(now),
                "usedAt": "0001-01-01T00:00:00Z",
                "type": "Runtime",
                "scenario_groups": None,
            },
            separators=(",", ":"),
        )
        return {
            "token": token,
            "connectorURL": connector_url,
            "used": False,
            "expiresAt": expires_at,
            "createdAt": now,
            "usedAt": _GO_ZERO_TIME,
            "raw": raw,
            "rawEncoded": base64.b64encode(raw.encode()).decode(),
            "type": "Runtime",
        }

    def _set_label(self, tenant: str, runtimeID: str, key: str, value: Any) -> dict[str, Any]:
        problems: dict[str, str] = {}
        if problem := label_key_problem(key):
            problems["key"] = problem
        if is_blank(value):
            problems["value"] = "cannot be blank"
        if problems:
            raise DirectorError.invalid_fields("LabelInput", problems)
        current = self._labelled(tenant, runtimeID)
        if not _is_modifiable(key):
            raise DirectorError.invalid(f"could not set unmodifiable label with key {key}")
        if key == SCENARIOS_LABEL:
            raise DirectorError.internal(_SCENARIOS_SET)
        labels = {**current.labels, key: value}
        self._store.replace_runtime(current.model_copy(update={"labels": labels}))
        return {"key": key, "value": value}

    def _delete_label(self, tenant: str, runtimeID: str, key: str) -> dict[str, Any]:
        current = self._labelled(tenant, runtimeID)
        if key not in current.labels:
            raise DirectorError.not_found("runtimeLabel")
        if not _is_modifiable(key):
            raise DirectorError.invalid(f"could not delete unmodifiable label with key {key}")
        if key == SCENARIOS_LABEL:
            raise DirectorError.internal(
                f"label with key {SCENARIOS_LABEL} cannot be deleted explicitly"
            )
        labels = {k: v for k, v in current.labels.items() if k != key}
        self._store.replace_runtime(current.model_copy(update={"labels": labels}))
        return {"key": key, "value": current.labels[key]}


# The one-time token resolver wraps the failed commit again (onetimetoken/resolver.go).
_COMMIT_REASONS = {
    "requestOneTimeTokenForRuntime": f"while committing transaction: {COMMIT_FAILED}",
}


def _database_error(answer: DatabaseAnswer, tenant: str, key: str) -> DirectorError:
    """A call's error while Director's database is gone (see the module docstring)."""
    if answer is DatabaseAnswer.TENANT_ACCESS:
        return DirectorError.tenant_access_lost(internal_tenant_id(tenant))
    if answer is DatabaseAnswer.BAD_CONNECTION:
        # The transaction could not begin; resolvers return that error as it is.
        return DirectorError.internal(f"input: {key} {BAD_CONNECTION}")
    return DirectorError.internal()


def _check_key_column(labels: dict[str, Any]) -> None:
    if any(len(key) > _LABEL_KEY_COLUMN for key in labels):
        raise DirectorError.internal()


def _whole_request_error(status: int, error: DirectorError, parsed: ParsedRequest) -> Response:
    """An answer for the request as a whole: one entry, no `path`, `data` null."""
    return Response(
        status,
        {"errors": [{"message": str(error), "extensions": error.extensions()}], "data": None},
        {f.key: [int(error.code)] for f in parsed.fields},
    )


def _presented(response: Response, parsed: ParsedRequest) -> Response:
    """A document Director cannot execute (HTTP 422), its errors as Director's presenter
    words errors it has no type for: code 10, the parser's text as the reason, no path."""
    if response.status != 422:
        return response
    entries = []
    for entry in (response.body or {}).get("errors", []):
        text: str = entry["message"]
        variable = _VARIABLE_ERROR.match(text)
        locations = entry.get("locations") or []
        if variable is not None:
            # gqlparser names a variable by its path, not by a place in the document.
            reason = f"input: variable.{variable.group(1)} {text}"
        elif locations:
            reason = f"input:{locations[0]['line']}: {text}"
        else:
            reason = f"input: {text}"
        error = DirectorError.internal(reason)
        entries.append({"message": str(error), "extensions": error.extensions()})
    return Response(
        422,
        {"errors": entries, "data": None},
        {f.key: [int(ErrorCode.INTERNAL_ERROR)] for f in parsed.fields},
        headers=response.headers,
    )
