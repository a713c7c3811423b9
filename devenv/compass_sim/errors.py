"""Compass error codes and the errors the simulator's resolvers raise.

Error tree:

    SimulatorError                  root; never leaves the simulator as a Python exception
    ├── DirectorError(code, ...)    one GraphQL error entry with
    │                               extensions {"error_code": <int>, "error": "<Name>"}
    └── ConnectorError(kind, ...)   one GraphQL error entry with extensions {"error": kind}

Codes and messages follow Director's `apperrors` package: the message is the
default text of the code, followed by sorted `[key=value; ...]` arguments. Code 10
(InternalError) is what Director's error presenter makes of everything that is not
one of its typed errors: a database error (a non-UUID ID, a label key too long for
its column, a filter query that is not JSON) reads `Internal Server Error
[errorID=<uuid>]`; a plain Go error (a missing runtime behind `setRuntimeLabel`, the
`scenarios` label) adds `, reason: <its text>`. So code 10 means "permanent mistake"
as often as "outage".

When Director's database fails, the same presenter answers: a failed commit is a
plain error (`while committing transaction: driver: bad connection`, shown as the
reason), a failed query mostly a typed internal error (no reason), and a label's
tenant check that could not run is code 26 (`DirectorError.tenant_access_lost`).
"""

from __future__ import annotations

import uuid
from enum import IntEnum

__all__ = [
    "BAD_CONNECTION",
    "COMMIT_FAILED",
    "ConnectorError",
    "DirectorError",
    "ErrorCode",
    "SimulatorError",
]

# What database/sql says when the connection broke under a statement or a commit.
BAD_CONNECTION = "driver: bad connection"
# Director's transaction wrapper (pkg/persistence) around a failed commit.
COMMIT_FAILED = f"while committing transaction: {BAD_CONNECTION}"


class ErrorCode(IntEnum):
    """Director's `extensions.error_code` values."""

    INTERNAL_ERROR = 10
    UNKNOWN_ERROR = 11
    NOT_FOUND = 20
    NOT_UNIQUE = 21
    INVALID_DATA = 22
    INSUFFICIENT_SCOPES = 23
    TENANT_REQUIRED = 24
    TENANT_NOT_FOUND = 25
    UNAUTHORIZED = 26
    INVALID_OPERATION = 27
    OPERATION_TIMEOUT = 28
    EMPTY_DATA = 29
    INCONSISTENT_DATA = 30
    NOT_UNIQUE_NAME = 31
    CONCURRENT_OPERATION = 32
    INVALID_STATUS_CONDITION = 33
    CANNOT_UPDATE_OBJECT_IN_MANY_BUNDLES = 34
    CONCURRENT_UPDATE = 35

    @property
    def error_name(self) -> str:
        """The `extensions.error` string, e.g. "InvalidData"."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def default_message(self) -> str:
        return _DEFAULT_MESSAGES[self]


_DEFAULT_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.INTERNAL_ERROR: "Internal Server Error",
    ErrorCode.UNKNOWN_ERROR: "Unknown error",
    ErrorCode.NOT_FOUND: "Object not found",
    ErrorCode.NOT_UNIQUE: "Object is not unique",
    ErrorCode.INVALID_DATA: "Invalid data",
    ErrorCode.INSUFFICIENT_SCOPES: "insufficient scopes provided",
    ErrorCode.TENANT_REQUIRED: "Tenant is required",
    ErrorCode.TENANT_NOT_FOUND: "Tenant not found",
    ErrorCode.UNAUTHORIZED: "Unauthorized",
    ErrorCode.INVALID_OPERATION: "The operation is not allowed",
    ErrorCode.OPERATION_TIMEOUT: "operation has timed out",
    ErrorCode.EMPTY_DATA: "Some required data was left out",
    ErrorCode.INCONSISTENT_DATA: "Inconsistent or out-of-range data",
    ErrorCode.NOT_UNIQUE_NAME: "Object name is not unique",
    ErrorCode.CONCURRENT_OPERATION: "Concurrent operation",
    ErrorCode.INVALID_STATUS_CONDITION: "Invalid status condition",
    ErrorCode.CANNOT_UPDATE_OBJECT_IN_MANY_BUNDLES: (
        "Can not update object that is part of more than one bundle"
    ),
    ErrorCode.CONCURRENT_UPDATE: "Could not update object due to concurrent update",
}


class SimulatorError(Exception):
    """Root of the errors a resolver raises to produce a GraphQL error entry."""

    def extensions(self) -> dict[str, object]:
        raise NotImplementedError


class DirectorError(SimulatorError):
    """A Director error: `message` as Director words it, plus the numeric code."""

    def __init__(self, code: ErrorCode, *, head: str | None = None, **arguments: object) -> None:
        self.code = code
        # The text of the plain Go error behind a code-10 answer, if there was one.
        self.reason: str | None = None
        self.below = ""
        text = head if head is not None else code.default_message
        if arguments:
            text += " [" + "; ".join(f"{k}={arguments[k]}" for k in sorted(arguments)) + "]"
        super().__init__(text)

    def extensions(self) -> dict[str, object]:
        return {"error_code": int(self.code), "error": self.code.error_name}

    @classmethod
    def not_found(cls, object_type: str, object_id: str | None = None) -> DirectorError:
        """A lookup that found no row names the object type only, so leave out `object_id`
        to answer as Director's runtime and label lookups do."""
        if object_id is None:
            return cls(ErrorCode.NOT_FOUND, object=object_type)
        return cls(ErrorCode.NOT_FOUND, object=object_type, ID=object_id)

    @classmethod
    def internal(cls, reason: str | None = None, *, below: str = "") -> DirectorError:
        """Code 10 as the presenter words it (`reason`: the text of a plain Go error, which
        gqlgen prefixes with the field's path, `below` it for an argument: see `located`)."""
        error_id = uuid.uuid4()
        if reason is None:
            return cls(ErrorCode.INTERNAL_ERROR, head=f"Internal Server Error [errorID={error_id}]")
        error = cls(
            ErrorCode.INTERNAL_ERROR,
            head=f"Internal Server Error [errorID={error_id}, reason: {reason}]",
        )
        error.reason = reason
        error.below = below
        return error

    def located(self, path: str) -> DirectorError:
        """This error as raised by the resolver of the field at `path`: gqlgen wraps a plain
        error in a GraphQL error first, whose text then reads "input: <path> <text>"."""
        if self.reason is None:
            return self
        return DirectorError.internal(f"input: {path}{self.below} {self.reason}")

    @classmethod
    def tenant_access_lost(cls, internal_tenant: str) -> DirectorError:
        """Code 26 from creating a runtime label whose parent access check failed in the
        database (internal/repo/create.go): the check's internal error, wrapped."""
        return cls(
            ErrorCode.UNAUTHORIZED,
            reason=(
                f"Tenant {internal_tenant} does not have access to the parent of the currently "
                "created runtimeLabel: while checking for tenant access: Internal Server Error: "
                "Unexpected error while executing SQL query"
            ),
        )

    @classmethod
    def not_allowed(cls, reason: str, *, object_type: str | None = None) -> DirectorError:
        if object_type is None:
            return cls(ErrorCode.INVALID_OPERATION, reason=reason)
        return cls(ErrorCode.INVALID_OPERATION, reason=reason, object=object_type)

    @classmethod
    def invalid(cls, reason: str) -> DirectorError:
        return cls(ErrorCode.INVALID_DATA, reason=reason)

    @classmethod
    def invalid_fields(cls, type_name: str, fields: dict[str, str]) -> DirectorError:
        return cls(ErrorCode.INVALID_DATA, head=f"Invalid data {type_name}", **fields)


class ConnectorError(SimulatorError):
    """A Connector error; `kind` is e.g. "Forbidden", "WrongInput", "BadRequest"."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)

    def extensions(self) -> dict[str, object]:
        return {"error": self.kind}
