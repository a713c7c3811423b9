"""Director: the runtime part of Compass's GraphQL API, with the real semantics.

Request checks, in order:
1. Bearer token (HTTP level): missing, unknown or expired -> HTTP 401 with one
   error entry, code 26 (the real gateway rejects such requests before Director).
2. Per root field: scope (`runtime:read` for queries, `runtime:write` for
   mutations) -> 23; `Tenant` header missing -> 24; tenant not configured -> 25;
   then injected faults; then the resolver (input rules -> 22, missing runtime -> 20).

Semantics (as the real Director):
- Runtimes belong to the caller's tenant; names are not unique; IDs are UUIDs.
- register/update add label `isNormalized: "true"` unless given (configurable);
  update replaces name, description, status and all labels.
- `runtime(id)` is null when missing; unregister/update/labels of a missing
  runtime -> 20.
- `runtimes`: filters ANDed, JSON containment; `first` in 1..max page size (22
  otherwise); ordered by name; offset cursors; `totalCount` counts all matches.
- `requestOneTimeTokenForRuntime`: a new token (URL-safe base64 of 64 random
  bytes) for Connector, single use, bound to the runtime and tenant, expiring after
  the configured TTL. Earlier tokens stay valid until used or expired.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from graphql import GraphQLResolveInfo, GraphQLSchema

from .calls import Call
from .config import SimConfig
from .errors import DirectorError, ErrorCode
from .graphql_http import GraphQLEndpoint, ParsedRequest, Response, load_schema
from .labels import (
    description_problem,
    is_blank,
    label_key_problem,
    parse_filters,
    runtime_name_problem,
)
from .oauth import BearerError, OAuthServer, hash_token
from .operations import DIRECTOR_MUTATIONS, DIRECTOR_QUERIES, required_scope
from .store import ConnectorTokenRecord, RuntimeRecord, RuntimeStatusCondition, Store, TokenKind

__all__ = ["Director", "DirectorContext", "new_connector_token", "serialize_timestamp"]

NORMALIZED_LABEL = "isNormalized"


@dataclass
class DirectorContext:
    tenant: str | None
    scopes: frozenset[str]
    call: Call


def serialize_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_connector_token() -> str:
    """URL-safe base64 of 64 random bytes, as Compass generates its tokens."""
    return base64.urlsafe_b64encode(secrets.token_bytes(64)).decode()


def _parse_labels(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("labels must be a JSON object")
    return value


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
    return base64.b64encode(f"offset:{offset}".encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        prefix, _, number = base64.b64decode(cursor, validate=True).decode().partition(":")
        offset = int(number)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise DirectorError.invalid("cursor is not correct") from None
    if prefix != "offset" or offset < 0:
        raise DirectorError.invalid("cursor is not correct")
    return offset


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


def _runtime_labels(obj: dict[str, Any], _info: GraphQLResolveInfo, key: str | None = None) -> Any:
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
        if parsed.rejection is not None:
            return parsed.rejection
        context = DirectorContext(tenant=tenant or None, scopes=token.scopes, call=call)
        return self.endpoint.execute(parsed, context)

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
            tenant = self._check_tenant(context.tenant)
            context.call.enter(operation, str(info.path.key))
            result = resolver(tenant, **arguments)
            context.call.done(operation)
            return result

        return resolve

    def _check_tenant(self, tenant: str | None) -> str:
        if not tenant:
            raise DirectorError(ErrorCode.TENANT_REQUIRED)
        if self._config.tenants is not None and tenant not in self._config.tenants:
            raise DirectorError(ErrorCode.TENANT_NOT_FOUND, externalTenant=tenant)
        return tenant

    def _existing(self, tenant: str, runtime_id: str) -> RuntimeRecord:
        record = self._store.get_runtime(tenant, runtime_id)
        if record is None:
            raise DirectorError.not_found("runtime", runtime_id)
        return record

    def _checked_input(self, type_name: str, data: dict[str, Any]) -> dict[str, Any]:
        problems: dict[str, str] = {}
        if problem := runtime_name_problem(data["name"]):
            problems["name"] = problem
        if problem := description_problem(data.get("description")):
            problems["description"] = problem
        labels: dict[str, Any] = dict(data.get("labels") or {})
        for key in sorted(labels):
            if problem := label_key_problem(key):
                problems["labels"] = f"({key}: {problem})"
                break
        if problems:
            raise DirectorError.invalid_fields(type_name, problems)
        if self._config.add_normalized_label and NORMALIZED_LABEL not in labels:
            labels[NORMALIZED_LABEL] = "true"
        condition = data.get("statusCondition") or RuntimeStatusCondition.INITIAL.value
        return {
            "name": data["name"],
            "description": data.get("description"),
            "labels": labels,
            "status_condition": RuntimeStatusCondition(condition),
            "application_namespace": data.get("applicationNamespace"),
        }

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
        offset = _decode_cursor(after)
        try:
            filters = parse_filters(filter)
        except ValueError as exc:
            raise DirectorError.invalid(str(exc)) from None
        items, total = self._store.list_runtimes(tenant, filters, offset=offset, limit=first)
        return {
            "data": [runtime_to_graphql(r) for r in items],
            "totalCount": total,
            "pageInfo": {
                "startCursor": after or "",
                "endCursor": _encode_cursor(offset + first),
                "hasNextPage": offset + first < total,
            },
        }

    def _runtime(self, tenant: str, id: str) -> dict[str, Any] | None:
        record = self._store.get_runtime(tenant, id)
        return runtime_to_graphql(record) if record is not None else None

    # -- mutations ------------------------------------------------------------------

    def _register(self, tenant: str, **arguments: Any) -> dict[str, Any]:
        fields = self._checked_input("RuntimeRegisterInput", arguments["in"])
        record = self._store.create_runtime(tenant, now=self._now(), **fields)
        return runtime_to_graphql(record)

    def _update(self, tenant: str, id: str, **arguments: Any) -> dict[str, Any]:
        fields = self._checked_input("RuntimeUpdateInput", arguments["in"])
        current = self._existing(tenant, id)
        updated = current.model_copy(update={**fields, "status_timestamp": self._now()})
        return runtime_to_graphql(self._store.replace_runtime(updated))

    def _unregister(self, tenant: str, id: str) -> dict[str, Any]:
        record = self._store.delete_runtime(tenant, id)
        if record is None:
            raise DirectorError.not_found("runtime", id)
        return runtime_to_graphql(record)

    def _request_token(
        self,
        tenant: str,
        id: str,
        systemAuthID: str | None = None,
    ) -> dict[str, Any]:
        self._existing(tenant, id)
        token = new_connector_token()
        now = self._now()
        expires_at = now + timedelta(seconds=self._config.ott_ttl_seconds)
        self._store.add_token(
            ConnectorTokenRecord(
                token_hash=hash_token(token),
                kind=TokenKind.ONE_TIME,
                runtime_id=id,
                tenant=tenant,
                created_at=now,
                expires_at=expires_at,
            )
        )
        connector_url = self._connector_url()
        raw = json.dumps({"token": token, "connectorURL": connector_url})
        return {
            "token": token,
            "connectorURL": connector_url,
            "used": False,
            "expiresAt": expires_at,
            "createdAt": now,
            "usedAt": None,
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
        current = self._existing(tenant, runtimeID)
        labels = {**current.labels, key: value}
        self._store.replace_runtime(current.model_copy(update={"labels": labels}))
        return {"key": key, "value": value}

    def _delete_label(self, tenant: str, runtimeID: str, key: str) -> dict[str, Any]:
        current = self._existing(tenant, runtimeID)
        if key not in current.labels:
            raise DirectorError.not_found("label", key)
        labels = {k: v for k, v in current.labels.items() if k != key}
        self._store.replace_runtime(current.model_copy(update={"labels": labels}))
        return {"key": key, "value": current.labels[key]}
