"""Pytest-free helpers for talking to a (simulated) Compass from tests and scripts.

The GraphQL documents here are the ones the simulator's own tests send; the
contract test validates each of them against the real Compass schemas too.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from .operations import READ_SCOPE, WRITE_SCOPE

__all__ = [
    "CONNECTOR_CONFIGURATION",
    "CONNECTOR_DOCUMENTS",
    "DELETE_RUNTIME_LABEL",
    "DIRECTOR_DOCUMENTS",
    "GET_RUNTIME",
    "LIST_RUNTIMES",
    "REGISTER_RUNTIME",
    "REQUEST_ONE_TIME_TOKEN",
    "RUNTIME_LABEL",
    "SET_RUNTIME_LABEL",
    "SIGN_CSR",
    "UNREGISTER_RUNTIME",
    "UPDATE_RUNTIME",
    "DirectorClient",
    "ManualClock",
    "build_csr",
    "fetch_token",
    "parse_subject",
]

RUNTIME_FIELDS = (
    "id name description labels applicationNamespace "
    "status { condition timestamp } metadata { creationTimestamp }"
)

REGISTER_RUNTIME = (
    "mutation RegisterRuntime($in: RuntimeRegisterInput!) "
    f"{{ result: registerRuntime(in: $in) {{ {RUNTIME_FIELDS} }} }}"
)
UPDATE_RUNTIME = (
    "mutation UpdateRuntime($id: ID!, $in: RuntimeUpdateInput!) "
    f"{{ result: updateRuntime(id: $id, in: $in) {{ {RUNTIME_FIELDS} }} }}"
)
UNREGISTER_RUNTIME = (
    "mutation UnregisterRuntime($id: ID!) "
    f"{{ result: unregisterRuntime(id: $id) {{ {RUNTIME_FIELDS} }} }}"
)
GET_RUNTIME = f"query GetRuntime($id: ID!) {{ result: runtime(id: $id) {{ {RUNTIME_FIELDS} }} }}"
LIST_RUNTIMES = (
    "query ListRuntimes($filter: [LabelFilter!], $first: Int, $after: PageCursor) "
    "{ result: runtimes(filter: $filter, first: $first, after: $after) "
    f"{{ data {{ {RUNTIME_FIELDS} }} "
    "pageInfo { startCursor endCursor hasNextPage } totalCount } }"
)
# A GraphQL document, not a credential (hence the noqa).
REQUEST_ONE_TIME_TOKEN = (
    "mutation RequestToken($id: ID!) { result: requestOneTimeTokenForRuntime(id: $id) "  # noqa: S105
    "{ token connectorURL used expiresAt createdAt usedAt raw rawEncoded type } }"
)
SET_RUNTIME_LABEL = (
    "mutation SetLabel($runtimeID: ID!, $key: String!, $value: Any!) "
    "{ result: setRuntimeLabel(runtimeID: $runtimeID, key: $key, value: $value) { key value } }"
)
DELETE_RUNTIME_LABEL = (
    "mutation DeleteLabel($runtimeID: ID!, $key: String!) "
    "{ result: deleteRuntimeLabel(runtimeID: $runtimeID, key: $key) { key value } }"
)
RUNTIME_LABEL = (
    "query RuntimeLabel($id: ID!, $key: String) { result: runtime(id: $id) { labels(key: $key) } }"
)

CONNECTOR_CONFIGURATION = (
    "query { result: configuration { token { token } "
    "certificateSigningRequestInfo { subject keyAlgorithm } "
    "managementPlaneInfo { directorURL certificateSecuredConnectorURL } } }"
)
SIGN_CSR = (
    "mutation Sign($csr: String!) { result: signCertificateSigningRequest(csr: $csr) "
    "{ certificateChain caCertificate clientCertificate } }"
)

DIRECTOR_DOCUMENTS: tuple[str, ...] = (
    REGISTER_RUNTIME,
    UPDATE_RUNTIME,
    UNREGISTER_RUNTIME,
    GET_RUNTIME,
    LIST_RUNTIMES,
    REQUEST_ONE_TIME_TOKEN,
    SET_RUNTIME_LABEL,
    DELETE_RUNTIME_LABEL,
    RUNTIME_LABEL,
)
CONNECTOR_DOCUMENTS: tuple[str, ...] = (CONNECTOR_CONFIGURATION, SIGN_CSR)


class ManualClock:
    """A clock for `CompassSimulator(clock=...)` that moves only when told to."""

    def __init__(self, start: float | None = None) -> None:
        self._lock = threading.Lock()
        self._now = time.time() if start is None else start

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def fetch_token(
    client: httpx.Client,
    token_url: str,
    *,
    client_id: str,
    client_secret: str,
    scopes: tuple[str, ...] = (READ_SCOPE, WRITE_SCOPE),
) -> str:
    response = client.post(
        token_url,
        auth=(client_id, client_secret),
        data={"grant_type": "client_credentials", "scope": " ".join(scopes)},
    )
    response.raise_for_status()
    token: str = response.json()["access_token"]
    return token


class DirectorClient:
    """Sends GraphQL documents to Director with a bearer token and a Tenant header."""

    def __init__(
        self, client: httpx.Client, director_url: str, *, token: str | None, tenant: str | None
    ) -> None:
        self.client = client
        self.url = director_url
        self.token = token
        self.tenant = tenant

    def post(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        **overrides: str | None,
    ) -> httpx.Response:
        """POST one document; `token=` / `tenant=` override (None: leave the header out)."""
        token = overrides.get("token", self.token)
        tenant = overrides.get("tenant", self.tenant)
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if tenant is not None:
            headers["Tenant"] = tenant
        return self.client.post(
            self.url, json={"query": query, "variables": variables or {}}, headers=headers
        )

    def result(self, query: str, variables: dict[str, Any] | None = None, **overrides: Any) -> Any:
        """`data.result` of a successful call; raises AssertionError with the errors otherwise."""
        response = self.post(query, variables, **overrides)
        body = response.json()
        if response.status_code != 200 or body.get("errors"):
            raise AssertionError(f"Director call failed: {response.status_code} {body}")
        return body["data"]["result"]


_SUBJECT_OIDS = {
    "CN": NameOID.COMMON_NAME,
    "C": NameOID.COUNTRY_NAME,
    "O": NameOID.ORGANIZATION_NAME,
    "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "L": NameOID.LOCALITY_NAME,
    "ST": NameOID.STATE_OR_PROVINCE_NAME,
}


def parse_subject(subject: str) -> dict[str, str]:
    """Split Connector's subject string: "O=a,OU=b,...,CN=c" -> {"O": "a", ...}."""
    return dict(part.split("=", 1) for part in subject.split(","))


def build_csr(
    subject: dict[str, str], key: rsa.RSAPrivateKey | None = None
) -> tuple[str, rsa.RSAPrivateKey]:
    """A CSR for `subject`, as base64 of PEM (what signCertificateSigningRequest wants)."""
    key = key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(_SUBJECT_OIDS[k], v) for k, v in subject.items()])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    pem = csr.public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode(), key
