"""The catalogue of operations the simulator serves and the scope each one needs.

An *operation* is a root field of a GraphQL request (Director or Connector) or the
OAuth token request. Counters, the request log and fault injection are keyed by
these names. A unit test checks that the catalogue equals the root fields of the
simulator's SDL files.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ALL_ENDPOINTS",
    "ALL_OPERATIONS",
    "CONNECTOR_OPERATIONS",
    "DIRECTOR_MUTATIONS",
    "DIRECTOR_QUERIES",
    "OAUTH_TOKEN",
    "READ_SCOPE",
    "UNPARSED",
    "WRITE_SCOPE",
    "Endpoint",
    "required_scope",
]

Endpoint = Literal["oauth", "director", "connector"]
ALL_ENDPOINTS: frozenset[Endpoint] = frozenset({"oauth", "director", "connector"})

READ_SCOPE = "runtime:read"
WRITE_SCOPE = "runtime:write"

OAUTH_TOKEN = "oauthToken"  # noqa: S105 - an operation name
DIRECTOR_QUERIES: frozenset[str] = frozenset({"runtimes", "runtime"})
DIRECTOR_MUTATIONS: frozenset[str] = frozenset(
    {
        "registerRuntime",
        "updateRuntime",
        "unregisterRuntime",
        "requestOneTimeTokenForRuntime",
        "setRuntimeLabel",
        "deleteRuntimeLabel",
    }
)
CONNECTOR_OPERATIONS: frozenset[str] = frozenset({"configuration", "signCertificateSigningRequest"})
ALL_OPERATIONS: frozenset[str] = (
    frozenset({OAUTH_TOKEN}) | DIRECTOR_QUERIES | DIRECTOR_MUTATIONS | CONNECTOR_OPERATIONS
)

# Name recorded for a GraphQL request whose body could not be parsed into operations.
UNPARSED = "<unparsed>"


def required_scope(operation: str) -> str | None:
    """The OAuth scope a Director operation needs (Director's scopes configuration)."""
    if operation in DIRECTOR_QUERIES:
        return READ_SCOPE
    if operation in DIRECTOR_MUTATIONS:
        return WRITE_SCOPE
    return None
