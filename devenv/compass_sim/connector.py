"""Connector: exchanges a one-time token for a client certificate, as Compass's chain does.

In Compass a token never reaches Connector: Oathkeeper hands it to the hydrator, which spends
it at Director and names the token's SystemAuth as the client; Connector serves whoever that
is. The simulator answers as that chain does (`tests/integration/real_director/
test_connector_contract.py` holds it to the real one):

- The token comes in the header `Connector-Token` (or the query parameter `token`). It is
  spent before the request is even read: a document that does not parse or validate spends it
  too. Either token of a SystemAuth serves either operation: Director's one-time token, or the
  token `configuration` returned (which replaces the SystemAuth's unused one).
- No token, or one that is unknown, spent or expired: HTTP 400 with an empty body, whatever
  the request (the chain passes an unusable identity on, and Connector refuses to parse it).
- `configuration` returns a fresh token on the same SystemAuth, the CSR subject (CN = the
  SystemAuth's ID: a new one per Director token, never the runtime's ID), key algorithm
  "rsa2048" and the certificate-secured URLs.
- `signCertificateSigningRequest(csr)` checks the CSR (base64 of PEM) against that subject and
  signs it with the in-memory CA; its mistakes are GraphQL errors with HTTP 200, worded as
  Connector words them, with `message` and `path` only.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from graphql import GraphQLResolveInfo, GraphQLSchema

from .ca import CertificateAuthority, CsrRejectedError, load_csr, subject_problem
from .calls import Call
from .config import CsrSubject, SimConfig
from .director import new_connector_token
from .errors import ConnectorError
from .graphql_http import GraphQLEndpoint, ParsedRequest, Response, load_schema
from .oauth import hash_token
from .store import ConnectorTokenRecord, Store, TokenKind, TokenRefusedError

__all__ = [
    "KEY_ALGORITHM",
    "REFUSED_MEDIA_TYPE",
    "Connector",
    "ConnectorContext",
    "ConnectorUrls",
    "get_request_body",
    "parse_csr",
    "refused",
    "sign_csr",
    "with_data_null",
]

KEY_ALGORITHM = "rsa2048"
# What Connector's refusal of an unusable identity carries: no body, this content type.
REFUSED_MEDIA_TYPE = "application/json;charset=UTF-8"


def refused() -> Response:
    """Connector's answer when no usable token (or certificate) names the client."""
    return Response(400, None, headers={"content-type": REFUSED_MEDIA_TYPE})


def with_data_null(response: Response) -> Response:
    """A request Connector's GraphQL server rejects before executing: gqlgen adds data null."""
    if response.body is None:
        return response
    return Response(response.status, {**response.body, "data": None}, headers=response.headers)


def get_request_body(query_params: Mapping[str, str]) -> bytes:
    """A GET request's GraphQL parameters as the JSON body a POST would carry."""
    request: dict[str, Any] = {"query": query_params.get("query")}
    if query_params.get("variables"):
        try:
            request["variables"] = json.loads(query_params["variables"])
        except ValueError:
            request["variables"] = query_params["variables"]
    if query_params.get("operationName"):
        request["operationName"] = query_params["operationName"]
    return json.dumps(request).encode()


def parse_csr(csr: str) -> x509.CertificateSigningRequest:
    """The CSR of `signCertificateSigningRequest(csr:)` (base64 of PEM), or Connector's error
    answer for it."""
    try:
        pem = base64.b64decode(csr, validate=True)
    except (binascii.Error, ValueError):
        raise ConnectorError(
            "BadRequest",
            "Error while decoding Certificate Signing Request: Error while parsing base64 "
            "content. Incorrect value provided.",
        ) from None
    try:
        return load_csr(pem)
    except CsrRejectedError as exc:
        raise ConnectorError(
            exc.kind, f"Error while signing Certificate Signing Request: {exc}"
        ) from None


def sign_csr(
    ca: CertificateAuthority, csr: str, subject: CsrSubject, common_name: str
) -> dict[str, str]:
    """`signCertificateSigningRequest`'s result for a client named `common_name`: the one place
    the simulator's Connectors check and sign a CSR."""
    request = parse_csr(csr)
    problem = subject_problem(request, subject, common_name)
    if problem is not None:
        raise ConnectorError(
            "WrongInput", f"Error while signing Certificate Signing Request: {problem}"
        )
    try:
        client_pem = ca.sign(request)
    except CsrRejectedError as exc:
        raise ConnectorError(
            exc.kind, f"Error while signing Certificate Signing Request: {exc}"
        ) from None
    ca_pem = ca.certificate_pem

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "certificateChain": b64(client_pem + ca_pem),
        "caCertificate": b64(ca_pem),
        "clientCertificate": b64(client_pem),
    }


@dataclass
class ConnectorContext:
    client: ConnectorTokenRecord  # the spent token: its SystemAuth, runtime and tenant
    call: Call


@dataclass(frozen=True)
class ConnectorUrls:
    director: str
    certificate_secured_connector: str


class Connector:
    def __init__(
        self,
        *,
        config: SimConfig,
        store: Store,
        ca: CertificateAuthority,
        clock: Callable[[], float],
        urls: Callable[[], ConnectorUrls],
    ) -> None:
        self._config = config
        self._store = store
        self._ca = ca
        self._clock = clock
        self._urls = urls
        schema = load_schema("connector.graphql")
        self._bind(schema)
        self.endpoint = GraphQLEndpoint(schema, plain_errors=True)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def handle(self, parsed: ParsedRequest, *, token: str | None, call: Call) -> Response:
        client = self._spend(token)
        if client is None:
            return refused()
        if parsed.rejection is not None:
            return with_data_null(parsed.rejection)
        return self.endpoint.execute(parsed, ConnectorContext(client=client, call=call))

    def _spend(self, token: str | None) -> ConnectorTokenRecord | None:
        """The token's record, now spent; None when it is missing, unknown, spent or expired."""
        if not token:
            return None
        try:
            return self._store.consume_token(
                hash_token(token), kinds={TokenKind.ONE_TIME, TokenKind.CSR}, now=self._now()
            )
        except TokenRefusedError:
            return None

    def _bind(self, schema: GraphQLSchema) -> None:
        assert schema.query_type is not None
        assert schema.mutation_type is not None
        schema.query_type.fields["configuration"].resolve = self._guard(
            "configuration", self._configuration
        )
        schema.mutation_type.fields["signCertificateSigningRequest"].resolve = self._guard(
            "signCertificateSigningRequest", self._sign
        )

    @staticmethod
    def _guard(operation: str, resolver: Callable[..., Any]) -> Callable[..., Any]:
        def resolve(_root: Any, info: GraphQLResolveInfo, **arguments: Any) -> Any:
            context: ConnectorContext = info.context
            context.call.enter(operation, str(info.path.key))
            result = resolver(context.client, **arguments)
            context.call.done(operation)
            return result

        return resolve

    def _configuration(self, client: ConnectorTokenRecord) -> dict[str, Any]:
        fresh = new_connector_token()
        now = self._now()
        self._store.add_token(
            ConnectorTokenRecord(
                token_hash=hash_token(fresh),
                kind=TokenKind.CSR,
                runtime_id=client.runtime_id,
                tenant=client.tenant,
                created_at=now,
                expires_at=now + timedelta(seconds=self._config.csr_token_ttl_seconds),
                system_auth_id=client.auth_id,
            )
        )
        urls = self._urls()
        return {
            "token": {"token": fresh},
            "certificateSigningRequestInfo": {
                "subject": self._config.csr_subject.render(client.auth_id),
                "keyAlgorithm": KEY_ALGORITHM,
            },
            "managementPlaneInfo": {
                "directorURL": urls.director,
                "certificateSecuredConnectorURL": urls.certificate_secured_connector,
            },
        }

    def _sign(self, client: ConnectorTokenRecord, csr: str) -> dict[str, str]:
        return sign_csr(self._ca, csr, self._config.csr_subject, client.auth_id)
