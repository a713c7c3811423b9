"""Connector: exchanges a one-time token for a client certificate.

- `configuration` (header `Connector-Token`: a one-time token from Director, or a
  token an earlier `configuration` returned) consumes the token and returns a fresh
  CSR token bound to the same runtime, the CSR subject (CN = runtime ID), key
  algorithm "rsa2048" and the management-plane URLs.
- `signCertificateSigningRequest(csr)` (header: a CSR token) consumes the token,
  then checks and signs the CSR (base64 of PEM) with the in-memory CA.
- Every token is consumed when presented, even if the request fails afterwards:
  a used, expired, unknown or wrong-kind token (or a missing header) is refused with
  a GraphQL error (HTTP 200, data null, `extensions.error` "Forbidden"), the way the
  real Connector answers when its token authentication fails.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from graphql import GraphQLResolveInfo, GraphQLSchema

from .ca import CertificateAuthority, CsrRejectedError, load_csr, subject_problem
from .calls import Call
from .config import SimConfig
from .director import new_connector_token
from .errors import ConnectorError
from .graphql_http import GraphQLEndpoint, ParsedRequest, Response, load_schema
from .oauth import hash_token
from .store import ConnectorTokenRecord, Store, TokenKind, TokenRefusedError

__all__ = ["Connector", "ConnectorContext"]

KEY_ALGORITHM = "rsa2048"


def parse_csr(csr: str) -> x509.CertificateSigningRequest:
    """The CSR of `signCertificateSigningRequest(csr:)` (base64 of PEM), or the Connector's
    error answer for it: the one place the simulator's Connectors read it."""
    try:
        pem = base64.b64decode(csr, validate=True)
    except (binascii.Error, ValueError):
        raise ConnectorError(
            "BadRequest", "Error while parsing base64 content. Incorrect value provided."
        ) from None
    try:
        return load_csr(pem)
    except CsrRejectedError as exc:
        raise ConnectorError(exc.kind, str(exc)) from None


@dataclass
class ConnectorContext:
    token: str | None
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
        self.endpoint = GraphQLEndpoint(schema)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def handle(self, parsed: ParsedRequest, *, token: str | None, call: Call) -> Response:
        if parsed.rejection is not None:
            return parsed.rejection
        return self.endpoint.execute(parsed, ConnectorContext(token=token or None, call=call))

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
            result = resolver(context.token, **arguments)
            context.call.done(operation)
            return result

        return resolve

    def _consume(self, token: str | None, kinds: set[TokenKind]) -> ConnectorTokenRecord:
        if token is None:
            raise ConnectorError(
                "Forbidden", "Failed to authenticate with token: Connector-Token header is missing"
            )
        try:
            return self._store.consume_token(hash_token(token), kinds=kinds, now=self._now())
        except TokenRefusedError as exc:
            raise ConnectorError("Forbidden", f"Failed to authenticate with token: {exc}") from None

    def _configuration(self, token: str | None) -> dict[str, Any]:
        used = self._consume(token, {TokenKind.ONE_TIME, TokenKind.CSR})
        fresh = new_connector_token()
        now = self._now()
        self._store.add_token(
            ConnectorTokenRecord(
                token_hash=hash_token(fresh),
                kind=TokenKind.CSR,
                runtime_id=used.runtime_id,
                tenant=used.tenant,
                created_at=now,
                expires_at=now + timedelta(seconds=self._config.csr_token_ttl_seconds),
            )
        )
        urls = self._urls()
        return {
            "token": {"token": fresh},
            "certificateSigningRequestInfo": {
                "subject": self._config.csr_subject.render(used.runtime_id),
                "keyAlgorithm": KEY_ALGORITHM,
            },
            "managementPlaneInfo": {
                "directorURL": urls.director,
                "certificateSecuredConnectorURL": urls.certificate_secured_connector,
            },
        }

    def _sign(self, token: str | None, csr: str) -> dict[str, str]:
        used = self._consume(token, {TokenKind.CSR})
        request = parse_csr(csr)
        problem = subject_problem(request, self._config.csr_subject, used.runtime_id)
        if problem is not None:
            raise ConnectorError("WrongInput", problem)
        client_pem = self._ca.sign(request)
        ca_pem = self._ca.certificate_pem

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        return {
            "certificateChain": b64(client_pem + ca_pem),
            "caCertificate": b64(ca_pem),
            "clientCertificate": b64(client_pem),
        }
