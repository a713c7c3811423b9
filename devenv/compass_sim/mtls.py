"""The certificate-secured side of the simulated Compass: what a runtime talks to once it has a
client certificate.

compass-runtime-agent, after exchanging its one-time token, keeps the connection with two URLs
it got in `configuration`'s `managementPlaneInfo`, both over mutual TLS with the client
certificate the simulator's CA signed:

- `certificateSecuredConnectorURL` (`/connector/graphql`): `configuration` without a token (the
  certificate's CN names the SystemAuth, and so the runtime; a token next to it is ignored) and
  `signCertificateSigningRequest` for a renewal; a CN that names no SystemAuth (its runtime
  unregistered) gets HTTP 400 with an empty body, as from the token-secured Connector;
- `directorURL` (`/director/graphql`): `runtime(id)` with its labels, `applicationsForRuntime`
  (always an empty page: the simulator has no applications) and `setRuntimeLabel`, which the
  agent uses for its events and console URLs. Header `Tenant` names the runtime's tenant.

A runtime sees only itself: another runtime's ID, or a tenant that cannot see it, is "not
found"; a CN that names no SystemAuth lacks every scope (code 23, as Director answers an
identity the hydrator could not map). A runtime registered in a subaccount is seen from
its global account too (the broker registers in the subaccount; the runtime's Secret names the
global account as `TENANT`). A client without a certificate from the
simulator's CA does not get past the TLS handshake.

`CertificateSecuredCompass(sim).start()` serves it from a thread of its own on an HTTPS port and
points `sim.certificate_secured` at its URLs, so the Connector hands them out from then on.
Calls are counted per operation (`calls()`), for tests.
"""

from __future__ import annotations

import json
import logging
import ssl
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from cryptography import x509
from cryptography.x509.oid import NameOID
from graphql import GraphQLResolveInfo, GraphQLSchema

from devenv import pki

from .connector import (
    KEY_ALGORITHM,
    REFUSED_MEDIA_TYPE,
    ConnectorUrls,
    refused,
    sign_csr,
    with_data_null,
)
from .director import new_connector_token
from .errors import DirectorError, ErrorCode
from .graphql_http import GraphQLEndpoint, load_schema
from .oauth import hash_token
from .store import ConnectorTokenRecord, TokenKind

if TYPE_CHECKING:
    from .server import CompassSimulator

__all__ = ["CertificateSecuredCompass"]

log = logging.getLogger(__name__)

_EMPTY_PAGE_INFO = {"startCursor": "", "endCursor": "", "hasNextPage": False}


@dataclass(frozen=True)
class _Caller:
    auth_id: str  # the certificate's CN: a SystemAuth's ID
    runtime_id: str | None  # None: the CN names no SystemAuth
    tenant: str | None  # the `Tenant` header


class CertificateSecuredCompass:
    def __init__(self, sim: CompassSimulator, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sim = sim
        self._host = host
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        connector_schema = load_schema("connector.graphql")
        director_schema = load_schema("runtime_director.graphql")
        self._bind_connector(connector_schema)
        self._bind_director(director_schema)
        self._connector = GraphQLEndpoint(connector_schema, plain_errors=True)
        self._director = GraphQLEndpoint(director_schema)

    # -- addresses and lifecycle ------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the certificate-secured Compass is not running")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"https://{host}:{self._server.server_address[1]}"

    def urls(self) -> ConnectorUrls:
        return ConnectorUrls(
            director=f"{self.url}/director/graphql",
            certificate_secured_connector=f"{self.url}/connector/graphql",
        )

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("already running")
        context = self._tls_context()
        handler = _handler(self)
        server = ThreadingHTTPServer((self._host, self._port), handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="compass-sim-mtls", daemon=True
        )
        self._thread.start()
        self._sim.certificate_secured = self.urls()
        log.info("certificate-secured Compass listening on %s", self.url)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        if self._sim.certificate_secured == self.urls():
            self._sim.certificate_secured = None
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(10)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def calls(self) -> dict[str, int]:
        """Operations served (root fields), whatever their outcome."""
        with self._lock:
            return dict(self._calls)

    def _tls_context(self) -> ssl.SSLContext:
        server_ca = pki.new_ca("compass-sim mTLS server CA")
        server = pki.issue(
            server_ca, common_name="compass-sim", server_hosts=(self._host, "localhost")
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_bytes(server.cert_pem + server_ca.cert_pem)
            key.write_bytes(server.key_pem)
            context.load_cert_chain(cert, key)
        # Only certificates the Connector issued open the door: the runtime's client certificate.
        context.load_verify_locations(cadata=self._sim.ca.certificate_pem.decode())
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    # -- requests -----------------------------------------------------------------------

    def caller(self, common_name: str, tenant: str | None) -> _Caller:
        """Who a client certificate names: its CN's SystemAuth and that one's runtime."""
        auth = self._sim.store.system_auth(common_name)
        return _Caller(common_name, auth.runtime_id if auth is not None else None, tenant)

    def handle(self, path: str, body: bytes, caller: _Caller) -> tuple[int, dict[str, Any] | None]:
        endpoint = {"/connector/graphql": self._connector, "/director/graphql": self._director}.get(
            path
        )
        if endpoint is None:
            return 404, {"errors": [{"message": f"no endpoint at {path}"}]}
        parsed = endpoint.parse_request(body)
        with self._lock:
            self._calls.update(field.name for field in parsed.fields)
        if endpoint is self._connector:
            if caller.runtime_id is None:
                return refused().status, None
            if parsed.rejection is not None:
                rejection = with_data_null(parsed.rejection)
                return rejection.status, rejection.body
        if parsed.rejection is not None:
            return parsed.rejection.status, parsed.rejection.body
        response = endpoint.execute(parsed, caller)
        return response.status, response.body

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._sim.clock(), UTC)

    # -- Connector ------------------------------------------------------------------------

    def _bind_connector(self, schema: GraphQLSchema) -> None:
        assert schema.query_type is not None
        assert schema.mutation_type is not None
        schema.query_type.fields["configuration"].resolve = _resolver(self._configuration)
        schema.mutation_type.fields["signCertificateSigningRequest"].resolve = _resolver(self._sign)

    def _configuration(self, caller: _Caller) -> dict[str, Any]:
        config = self._sim.config
        # The token answers a renewal's CSR only together with the certificate; the agent
        # sends the CSR with the certificate alone, as Connector allows.
        token = new_connector_token()
        now = self._now()
        assert caller.runtime_id is not None  # `handle` refused a CN without a SystemAuth
        runtime = self._sim.store.find_runtime(caller.runtime_id)
        self._sim.store.add_token(
            ConnectorTokenRecord(
                token_hash=hash_token(token),
                kind=TokenKind.CSR,
                runtime_id=caller.runtime_id,
                tenant=runtime.tenant if runtime is not None else "",
                created_at=now,
                expires_at=now + timedelta(seconds=config.csr_token_ttl_seconds),
                system_auth_id=caller.auth_id,
            )
        )
        urls = self.urls()
        return {
            "token": {"token": token},
            "certificateSigningRequestInfo": {
                "subject": config.csr_subject.render(caller.auth_id),
                "keyAlgorithm": KEY_ALGORITHM,
            },
            "managementPlaneInfo": {
                "directorURL": urls.director,
                "certificateSecuredConnectorURL": urls.certificate_secured_connector,
            },
        }

    def _sign(self, caller: _Caller, csr: str) -> dict[str, str]:
        return sign_csr(self._sim.ca, csr, self._sim.config.csr_subject, caller.auth_id)

    # -- Director -------------------------------------------------------------------------

    def _bind_director(self, schema: GraphQLSchema) -> None:
        assert schema.query_type is not None
        assert schema.mutation_type is not None
        schema.query_type.fields["runtime"].resolve = _resolver(self._runtime)
        schema.query_type.fields["applicationsForRuntime"].resolve = _resolver(self._applications)
        schema.mutation_type.fields["setRuntimeLabel"].resolve = _resolver(self._set_label)

    def _own_runtime(self, caller: _Caller, runtime_id: str, scope: str = "runtime:read") -> Any:
        if caller.runtime_id is None:
            raise DirectorError(ErrorCode.INSUFFICIENT_SCOPES, required=scope, actual="")
        runtime = self._sim.store.find_runtime(runtime_id)
        if (
            runtime is None
            or runtime_id != caller.runtime_id
            or caller.tenant not in runtime.visible_to
        ):
            raise DirectorError.not_found("Runtime", runtime_id)
        return runtime

    def _runtime(self, caller: _Caller, id: str) -> dict[str, Any]:
        runtime = self._own_runtime(caller, id)
        return {"id": runtime.id, "name": runtime.name, "labels": dict(runtime.labels)}

    def _applications(self, caller: _Caller, runtimeID: str, **_: Any) -> dict[str, Any]:
        self._own_runtime(caller, runtimeID, "application:read")
        return {"data": [], "pageInfo": _EMPTY_PAGE_INFO, "totalCount": 0}

    def _set_label(self, caller: _Caller, runtimeID: str, key: str, value: Any) -> dict[str, Any]:
        runtime = self._own_runtime(caller, runtimeID, "runtime:write")
        if not key:
            raise DirectorError(ErrorCode.INVALID_DATA, head="Invalid data", key="empty")
        labels = {**runtime.labels, key: value}
        self._sim.store.replace_runtime(runtime.model_copy(update={"labels": labels}))
        return {"key": key, "value": value}


def _resolver(method: Callable[..., Any]) -> Callable[..., Any]:
    def resolve(_root: Any, info: GraphQLResolveInfo, **arguments: Any) -> Any:
        return method(info.context, **arguments)

    return resolve


def _common_name(der: bytes | None) -> str | None:
    if not der:
        return None
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else None
    return value if isinstance(value, str) and value else None


def _handler(gateway: CertificateSecuredCompass) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as Go's client expects; every answer carries its length.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            assert isinstance(self.connection, ssl.SSLSocket)
            common_name = _common_name(self.connection.getpeercert(binary_form=True))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if common_name is None:
                self._answer(401, {"errors": [{"message": "client certificate without a CN"}]})
                return
            caller = gateway.caller(common_name, self.headers.get("Tenant") or None)
            status, payload = gateway.handle(self.path.split("?", 1)[0], body, caller)
            self._answer(status, payload)

        def _answer(self, status: int, payload: dict[str, Any] | None) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header(
                "Content-Type", REFUSED_MEDIA_TYPE if payload is None else "application/json"
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("mtls: " + format, *args)

    return Handler
