"""GraphQL over HTTP for the simulator's two schemas (graphql-core, schema first).

- The body is JSON `{"query", "variables", "operationName"}`; anything else: 400.
- Parse and validation errors: 422 with `extensions.code` GRAPHQL_PARSE_FAILED /
  GRAPHQL_VALIDATION_FAILED (as gqlgen, the real servers' library, answers);
  variables that do not fit the schema: 422 as well.
- Otherwise 200; each error entry has `message`, `path`, `locations` and the
  `extensions` of the `SimulatorError` that caused it (Director's presenter); with
  `plain_errors` (Connector's server, gqlgen's default presenter) only `message` and
  `path`. Any other exception in a
  resolver is a bug: it becomes Director's internal error (code 10) and is logged.
- Parsed and validated documents are cached per query text, since clients send the
  same few documents over and over.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    SelectionSetNode,
    build_schema,
    execute_sync,
    parse,
    validate,
)
from graphql.utilities import get_operation_ast
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ErrorCode, SimulatorError

__all__ = [
    "GraphQLEndpoint",
    "GraphQLRequest",
    "ParsedRequest",
    "Response",
    "RootField",
    "load_schema",
]

log = logging.getLogger(__name__)

_SCHEMA_DIR = Path(__file__).resolve().parent


def load_schema(file_name: str) -> GraphQLSchema:
    return build_schema((_SCHEMA_DIR / file_name).read_text())


class GraphQLRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    query: str
    variables: dict[str, Any] | None = None
    operation_name: str | None = Field(default=None, alias="operationName")


@dataclass(frozen=True)
class RootField:
    key: str  # response key: the alias, or the field name
    name: str  # the field name = the operation name used for counters and faults


@dataclass(frozen=True)
class _Prepared:
    document: DocumentNode | None
    errors: tuple[GraphQLError, ...]
    code: str | None  # GRAPHQL_PARSE_FAILED / GRAPHQL_VALIDATION_FAILED


@dataclass
class ParsedRequest:
    request: GraphQLRequest | None
    document: DocumentNode | None
    fields: list[RootField]
    rejection: Response | None  # set when the request cannot be executed at all


@dataclass
class Response:
    status: int
    body: dict[str, Any] | None  # None: no body at all
    # Error codes per root response key (-1: an error entry without error_code).
    errors_by_key: dict[str, list[int]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def _request_error(status: int, message: str, code: str | None = None) -> Response:
    entry: dict[str, Any] = {"message": message}
    if code:
        entry["extensions"] = {"code": code}
    return Response(status, {"errors": [entry]})


class GraphQLEndpoint:
    def __init__(
        self, schema: GraphQLSchema, *, cache_size: int = 256, plain_errors: bool = False
    ) -> None:
        self.schema = schema
        self._plain_errors = plain_errors
        self._prepare = lru_cache(maxsize=cache_size)(self._prepare_uncached)

    def _prepare_uncached(self, query: str) -> _Prepared:
        try:
            document = parse(query)
        except GraphQLError as exc:
            return _Prepared(None, (exc,), "GRAPHQL_PARSE_FAILED")
        errors = validate(self.schema, document)
        if errors:
            # Keep the document: its root fields still name the operations for the log.
            return _Prepared(document, tuple(errors), "GRAPHQL_VALIDATION_FAILED")
        return _Prepared(document, (), None)

    def parse_request(self, body: bytes) -> ParsedRequest:
        try:
            request = GraphQLRequest.model_validate(json.loads(body))
        except (ValueError, ValidationError):
            rejection = _request_error(400, "request body must be JSON with a 'query' string")
            return ParsedRequest(None, None, [], rejection)
        prepared = self._prepare(request.query)
        if prepared.document is None:
            body_errors = [_format_plain(e, prepared.code) for e in prepared.errors]
            return ParsedRequest(request, None, [], Response(422, {"errors": body_errors}))
        operation = get_operation_ast(prepared.document, request.operation_name)
        fields = []
        if operation is not None:
            fields = _root_fields(prepared.document, operation.selection_set)
        if prepared.errors:
            body_errors = [_format_plain(e, prepared.code) for e in prepared.errors]
            return ParsedRequest(request, None, fields, Response(422, {"errors": body_errors}))
        if operation is None:
            rejection = _request_error(
                422, "operation not found or ambiguous", "GRAPHQL_VALIDATION_FAILED"
            )
            return ParsedRequest(request, None, [], rejection)
        return ParsedRequest(request, prepared.document, fields, None)

    def execute(self, parsed: ParsedRequest, context: Any) -> Response:
        assert parsed.request is not None
        assert parsed.document is not None
        result = execute_sync(
            self.schema,
            parsed.document,
            context_value=context,
            variable_values=parsed.request.variables,
            operation_name=parsed.request.operation_name,
        )
        body: dict[str, Any] = {"data": result.data}
        errors_by_key: dict[str, list[int]] = {}
        if result.errors:
            body["errors"] = [self._format(error, errors_by_key) for error in result.errors]
            if self._plain_errors:
                body["errors"] = [
                    {k: v for k, v in entry.items() if k in ("message", "path")}
                    for entry in body["errors"]
                ]
        if result.data is None and result.errors and all(not e.path for e in result.errors):
            # Variables that do not match the schema: nothing was executed.
            if self._plain_errors:
                body = {"errors": [_variable_error(e) for e in result.errors], "data": None}
            return Response(422, body, errors_by_key)
        return Response(200, body, errors_by_key)

    @staticmethod
    def _format(error: GraphQLError, errors_by_key: dict[str, list[int]]) -> dict[str, Any]:
        original = error.original_error
        entry = _format_plain(error, None)
        if isinstance(original, SimulatorError):
            entry["message"] = str(original)
            entry["extensions"] = original.extensions()
        elif original is not None and error.path:
            # An exception inside a resolver that is not a simulator error: a bug.
            error_id = str(uuid.uuid4())
            log.error("resolver failed [errorID=%s]", error_id, exc_info=original)
            entry["message"] = f"Internal Server Error [errorID={error_id}]"
            entry["extensions"] = {
                "error_code": int(ErrorCode.INTERNAL_ERROR),
                "error": ErrorCode.INTERNAL_ERROR.error_name,
            }
        if error.path:
            code = entry.get("extensions", {}).get("error_code", -1)
            errors_by_key.setdefault(str(error.path[0]), []).append(int(code))
        return entry


_VARIABLE = re.compile(r"Variable '\$(\w+)'")


def _variable_error(error: GraphQLError) -> dict[str, Any]:
    """A variable that does not fit, as gqlgen's default presenter words it."""
    found = _VARIABLE.search(error.message)
    entry: dict[str, Any] = {
        "message": "must be defined" if "was not provided" in error.message else error.message
    }
    if found:
        entry["path"] = ["variable", found.group(1)]
    entry["extensions"] = {"code": "GRAPHQL_VALIDATION_FAILED"}
    return entry


def _format_plain(error: GraphQLError, code: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"message": error.message}
    if error.path:
        entry["path"] = list(error.path)
    if error.locations:
        entry["locations"] = [{"line": loc.line, "column": loc.column} for loc in error.locations]
    if code:
        entry["extensions"] = {"code": code}
    elif error.extensions:
        entry["extensions"] = dict(error.extensions)
    return entry


def _root_fields(document: DocumentNode, selection_set: SelectionSetNode) -> list[RootField]:
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    fields: list[RootField] = []
    seen: set[str] = set()

    def walk(selections: SelectionSetNode, visiting: frozenset[str]) -> None:
        for selection in selections.selections:
            if isinstance(selection, FieldNode):
                name = selection.name.value
                key = selection.alias.value if selection.alias else name
                if not name.startswith("__") and key not in seen:
                    seen.add(key)
                    fields.append(RootField(key, name))
            elif isinstance(selection, InlineFragmentNode):
                walk(selection.selection_set, visiting)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = fragments.get(name)
                if fragment is not None and name not in visiting:
                    walk(fragment.selection_set, visiting | {name})

    walk(selection_set, frozenset())
    return fields
