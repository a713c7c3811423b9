"""The gateway in front of the real Director: what Hydra, Oathkeeper and the hydrator do in Compass.

Director never sees a caller's OAuth token. In Compass, Hydra issues an opaque access token for
client credentials, Oathkeeper introspects it on every request, the hydrator maps the `Tenant`
header (an external ID) to the internal tenant ID, and Director receives an RS256 JWT it
verifies against a JWKS. This gateway does the same in one process:

- `POST /oauth2/token`: client credentials (HTTP basic auth, or `client_id`/`client_secret` in
  the form), `grant_type=client_credentials`, optional `scope`; an opaque token with `expires_in`.
- `POST /director/graphql`: the bearer must be one we issued (else 401, as Oathkeeper answers);
  the request goes on to Director with a fresh JWT carrying the claims Director reads.
- `GET /.well-known/jwks.json`: the key Director verifies with.
- `POST /connector/graphql`: Connector's `configuration` and `signCertificateSigningRequest`
  for the one-time tokens Director issued (see "The Connector" below).
- on a port of its own, when started (`start_certificate_secured`): the certificate-secured
  Connector and Director a runtime uses with its client certificate (`CertificateSecuredGateway`).
- `/_gateway/calls` (GET, DELETE), `/_gateway/faults` (GET, PUT, DELETE), `/_gateway/down`,
  `/_gateway/credentials` and `/_gateway/latency` (PUT, DELETE): counters and fault injection
  for a stack run as a separate process (`python -m devenv.real_director`).

A lost answer is produced *after* Director answered, so Director has acted and committed: the
caller then gets what Compass's Istio ingress (Envoy) sends when its upstream times out,
`504` with the body `upstream request timeout`, or, in mode `drop`, a connection closed without
an answer (a load balancer or proxy restarting mid-request).

Credentials refused (`refuse_credentials`): the token endpoint answers `401
{"error": "invalid_client"}` (or another 4xx) to the client's credentials, as Hydra does for a
client whose secret was rotated or which was deleted, and every access token issued before is
revoked, so Director's front door answers them 401 as Oathkeeper does for an unknown bearer.
`accept_credentials` lets the same credentials in again (a rotated secret put back); revoked
tokens stay revoked.

A slow Director (`set_latency`): each call of `/director/graphql` waits a uniform random time in
a range before it is passed on.

Compass down (`set_down`): every route but the admin API answers as an unavailable Compass does:
`503` with Envoy's body `no healthy upstream` (mode `503`), connections closed without an answer
(`drop`), or connections refused (`refuse`: the gateway stops listening and listens again on the
same port when the fault is cleared; its admin API is gone meanwhile, so this mode is for the
Python API only). Director itself keeps running, as it would behind a broken ingress.

The Connector. In Compass, a runtime's one-time token reaches Connector through Oathkeeper, whose
hydrator asks Director for the SystemAuth holding that token (`systemAuthByToken`: a row of
`system_auths` whose `value` JSON has `OneTimeToken.Token` = the token and `Used` false, refused
when `CreatedAt` + the token's validity has passed) and marks it used
(`invalidateSystemAuthOneTimeToken`: `Used` true, `UsedAt` now), then passes the SystemAuth's ID
to Connector as the client ID. Connector names the certificate after that client ID (CN = the
SystemAuth ID, which Compass maps back to the runtime for certificate-secured calls) and gets the
CSR token from Director with `requestOneTimeTokenForRuntime(id: "", systemAuthID: <ID>)`, which
puts a fresh one-time token on the same SystemAuth. The gateway does the hydrator's part
directly on Director's database (`DirectorTokens`: one `UPDATE ... WHERE` that finds, checks and
spends the token, so a token is spent once however many present it), and asks Director itself
for the CSR token. The rest is the simulator's Connector: its schema, its answers (a token that
names no one: HTTP 400 with an empty body, as the real chain answers), CSR checks and
certificate authority (`devenv.compass_sim`). The real Connector, hydrator and Oathkeeper run
instead when the stack is started with `real_connector` (connector.py).

It is a plain ASGI app, served by uvicorn on a thread of its own, so the Python API works from
any thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import functools
import json
import logging
import random
import secrets
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

import httpx
import jwt
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from graphql import (
    FieldNode,
    GraphQLError,
    GraphQLResolveInfo,
    GraphQLSchema,
    OperationDefinitionNode,
    parse,
)

from devenv import pki
from devenv.compass_sim.ca import CertificateAuthority
from devenv.compass_sim.config import CsrSubject
from devenv.compass_sim.connector import (
    KEY_ALGORITHM,
    REFUSED_MEDIA_TYPE,
    ConnectorUrls,
    refused,
    sign_csr,
    with_data_null,
)
from devenv.compass_sim.errors import ConnectorError
from devenv.compass_sim.graphql_http import GraphQLEndpoint, load_schema

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
LossMode = Literal["504", "drop"]
DownMode = Literal["refuse", "drop", "503"]
TenantResolver = Callable[[str], str | None]
# psql-style query on Director's database: `:'name'` in the SQL is a quoted parameter.
Query = Callable[[str, Mapping[str, str]], list[tuple[str, ...]]]

# The flow and consumer type the hydrator puts in the token of an OAuth client that belongs
# to an integration system: Director then treats the caller as the Kyma provisioning client
# (adds `runtimeType: kyma`, `region`, ...), as compass-manager's client is treated in Compass.
FLOW = "OAuth2"
CONSUMER_TYPE = "Integration System"
DEFAULT_SCOPES = frozenset({"runtime:read", "runtime:write"})
# What a runtime's client certificate may do at Director: read itself and its applications,
# set its own labels (compass-runtime-agent's console and events URLs).
RUNTIME_SCOPES = ("runtime:read", "runtime:write", "application:read")
ACCESS_TOKEN_TTL = 3600
# Director checks `exp`; a token is reused until this close to it, so the gateway signs about
# once a minute per (client token, tenant), not once per request.
_JWT_TTL = 300
_JWT_REUSE_MARGIN = 60
_KEY_ID = "real-director-gateway"
_CSR_MUTATION = (
    'mutation ($auth: ID!) { result: requestOneTimeTokenForRuntime(id: "", systemAuthID: $auth) '
    "{ token } }"
)
_ADMIN = "/_gateway"
GRAPHQL_PATH = "/director/graphql"
TOKEN_PATH = "/oauth2/token"  # noqa: S105 - a path, not a secret
JWKS_PATH = "/.well-known/jwks.json"
CONNECTOR_PATH = "/connector/graphql"
# What Istio's ingress (Envoy) answers while no backend is up.
UNAVAILABLE_BODY = b"no healthy upstream"
# The client certificates the gateway's Connector signs; the subject's fixed part is ours.
CERTIFICATE_VALIDITY_SECONDS = 90 * 24 * 3600
CSR_SUBJECT = CsrSubject(organization="kyma-compass-pull", organizational_unit="real-director")


@dataclass
class LossRule:
    """Lose the answer to calls whose GraphQL operation or top-level field is `operation`."""

    operation: str
    ratio: float = 1.0
    remaining: int | None = None  # None: without end
    mode: LossMode = "504"

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"ratio must be within 0..1, not {self.ratio}")
        if self.remaining is not None and self.remaining < 0:
            raise ValueError(f"count must be >= 0, not {self.remaining}")
        if self.mode not in ("504", "drop"):
            raise ValueError(f"mode must be '504' or 'drop', not {self.mode!r}")


@dataclass(frozen=True)
class _Token:
    client_id: str
    scopes: tuple[str, ...]
    expires_at: float


@functools.lru_cache(maxsize=256)
def _operations_of(query: str, operation_name: str | None) -> tuple[tuple[str, ...], str | None]:
    """(top-level fields, e.g. `registerRuntime`; the operation's own name, if any) of a call.

    No fields when the document does not parse: Director answers that itself."""
    try:
        document = parse(query)
    except GraphQLError:
        return (), None
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    chosen = [
        op
        for op in operations
        if operation_name is None or (op.name is not None and op.name.value == operation_name)
    ]
    if len(chosen) != 1:
        return (), None
    op = chosen[0]
    fields = tuple(s.name.value for s in op.selection_set.selections if isinstance(s, FieldNode))
    return fields, op.name.value if op.name is not None else None


@dataclass(frozen=True)
class SpentToken:
    """A runtime's one-time token, found in Director's database and spent there."""

    system_auth_id: str  # the SystemAuth holding it: Connector's client ID, the certificate's CN
    runtime_id: str
    tenant: str  # internal ID of the tenant the token was requested in
    external_tenant: str


# Director's `systemAuthByToken` (a SystemAuth whose value JSON contains the token, unused),
# its validity check (`CreatedAt` + the token type's validity; Director stores the sum as
# `ExpiresAt`) and `invalidateSystemAuthOneTimeToken` (`Used` true, `UsedAt` now, as Go writes
# a time) in one statement: the row lock makes a second spender find `Used` true.
_SPEND_SQL = """
UPDATE system_auths AS s
SET value = jsonb_set(
    jsonb_set(s.value, '{OneTimeToken,Used}', 'true'::jsonb),
    '{OneTimeToken,UsedAt}',
    to_jsonb(to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
WHERE s.runtime_id IS NOT NULL
  AND s.value @> jsonb_build_object(
      'OneTimeToken', jsonb_build_object('Token', :'token'::text, 'Used', false))
  AND (s.value->'OneTimeToken'->>'ExpiresAt')::timestamptz > now()
RETURNING s.id, s.runtime_id, COALESCE(s.tenant_id::text, ''),
  COALESCE((SELECT t.external_tenant FROM business_tenant_mappings t WHERE t.id = s.tenant_id), '')
"""

_SYSTEM_AUTH_SQL = """
SELECT s.id, s.runtime_id, COALESCE(s.tenant_id::text, ''),
  COALESCE((SELECT t.external_tenant FROM business_tenant_mappings t WHERE t.id = s.tenant_id), '')
FROM system_auths s WHERE s.id::text = :'id' AND s.runtime_id IS NOT NULL
"""


class DirectorTokens:
    """One-time tokens of runtimes as Director stores them (`system_auths`), spent as Compass's
    hydrator spends them through Director."""

    def __init__(self, query: Query) -> None:
        self._query = query

    def spend(self, token: str) -> SpentToken | None:
        """The token's SystemAuth, now marked used; None when no runtime has this token unused
        and valid (unknown, used, expired: the hydrator does not say which either)."""
        if not token:
            return None
        rows = self._query(_SPEND_SQL, {"token": token})
        if not rows:
            return None
        system_auth_id, runtime_id, tenant, external = rows[0]
        return SpentToken(system_auth_id, runtime_id, tenant, external)

    def system_auth(self, system_auth_id: str) -> SpentToken | None:
        """A runtime's SystemAuth by its ID (a client certificate's CN), whatever its token's
        state; None when there is none (the runtime unregistered, or not a runtime's)."""
        rows = self._query(_SYSTEM_AUTH_SQL, {"id": system_auth_id})
        if not rows:
            return None
        found, runtime_id, tenant, external = rows[0]
        return SpentToken(found, runtime_id, tenant, external)


class GatewayConnector:
    """Connector's token-authenticated API over Director's one-time tokens.

    The presented token is spent before the request is read, as the hydrator spends it; either
    token of a SystemAuth serves either operation. `configuration` answers with a CSR token
    Director puts on the same SystemAuth (`request_csr_token`), the subject (CN = the SystemAuth
    ID) and the certificate-secured URLs, if any; `signCertificateSigningRequest` signs a CSR
    for exactly that subject. No usable token: HTTP 400 with an empty body, as the real chain
    answers. Calls are synchronous (database and Director): run
    them off the event loop.
    """

    def __init__(
        self,
        tokens: DirectorTokens,
        *,
        request_csr_token: Callable[[SpentToken], str],
        urls: Callable[[], ConnectorUrls | None],
    ) -> None:
        self._tokens = tokens
        self._request_csr_token = request_csr_token
        self._urls = urls
        self.ca = CertificateAuthority(
            clock=time.time, validity_seconds=CERTIFICATE_VALIDITY_SECONDS
        )
        self._lock = threading.Lock()
        self._spent: Counter[str] = Counter()  # runtime ID -> tokens spent here
        schema = load_schema("connector.graphql")
        self._bind(schema)
        self._endpoint = GraphQLEndpoint(schema, plain_errors=True)

    def spent(self, runtime_id: str) -> int:
        """Tokens of this runtime spent at the Connector (one-time and CSR tokens)."""
        with self._lock:
            return self._spent[runtime_id]

    def system_auth(self, system_auth_id: str) -> SpentToken | None:
        """The runtime's SystemAuth a certificate's CN names, from Director's database."""
        return self._tokens.system_auth(system_auth_id)

    def handle(
        self, body: bytes, token: str | None, *, certificate_cn: str | None = None
    ) -> tuple[int, dict[str, Any] | None]:
        """(status, body; None: no body) as Compass answers: the token is spent (or the
        certificate's CN looked up) before the request is read, and without a client the
        answer is HTTP 400 with an empty body."""
        client = self._client(token, certificate_cn)
        if client is None:
            return refused().status, None
        parsed = self._endpoint.parse_request(body)
        if parsed.rejection is not None:
            rejection = with_data_null(parsed.rejection)
            return rejection.status, rejection.body
        response = self._endpoint.execute(parsed, client)
        return response.status, response.body

    def _bind(self, schema: GraphQLSchema) -> None:
        assert schema.query_type is not None
        assert schema.mutation_type is not None

        def configuration(_root: Any, info: GraphQLResolveInfo) -> dict[str, Any]:
            return self._configuration(info.context)

        def sign(_root: Any, info: GraphQLResolveInfo, csr: str) -> dict[str, str]:
            return self._sign(info.context, csr)

        schema.query_type.fields["configuration"].resolve = configuration
        schema.mutation_type.fields["signCertificateSigningRequest"].resolve = sign

    def _client(self, token: str | None, certificate_cn: str | None) -> SpentToken | None:
        """Who calls, as the hydrator finds it: by token first, then by the client certificate
        (its CN names the SystemAuth); None when neither names one."""
        if token or certificate_cn is None:
            return self._spend(token)
        return self._tokens.system_auth(certificate_cn)

    def _spend(self, token: str | None) -> SpentToken | None:
        spent = self._tokens.spend(token) if token else None
        if spent is not None:
            with self._lock:
                self._spent[spent.runtime_id] += 1
        return spent

    def _configuration(self, spent: SpentToken) -> dict[str, Any]:
        try:
            fresh = self._request_csr_token(spent)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ConnectorError("Internal", f"could not get one time token: {exc}") from None
        urls = self._urls()
        return {
            "token": {"token": fresh},
            "certificateSigningRequestInfo": {
                "subject": CSR_SUBJECT.render(spent.system_auth_id),
                "keyAlgorithm": KEY_ALGORITHM,
            },
            "managementPlaneInfo": {
                "directorURL": urls.director if urls else None,
                "certificateSecuredConnectorURL": (
                    urls.certificate_secured_connector if urls else None
                ),
            },
        }

    def _sign(self, spent: SpentToken, csr: str) -> dict[str, str]:
        return sign_csr(self.ca, csr, CSR_SUBJECT, spent.system_auth_id)


class Gateway:
    def __init__(
        self,
        *,
        client_id: str,
        client_secret: str,
        resolve_tenant: TenantResolver,
        scopes: frozenset[str] = DEFAULT_SCOPES,
        upstream_timeout: float = 60.0,
        rng: random.Random | None = None,
        tokens: DirectorTokens | None = None,
    ) -> None:
        self.client_id = client_id
        self._client_secret = client_secret
        self._scopes = scopes
        self._resolve_tenant = resolve_tenant
        self._upstream_timeout = upstream_timeout
        self._rng = rng or random.Random()
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        self._jwks = json.dumps(
            {"keys": [{**jwk, "kid": _KEY_ID, "alg": "RS256", "use": "sig"}]}
        ).encode()
        self._tokens: dict[str, _Token] = {}
        self._jwts: dict[tuple[str, str | None, str | None], tuple[str, float]] = {}
        self._tenants: dict[str, str] = {}
        self._lock = threading.Lock()
        self._rules: list[LossRule] = []
        self._calls: Counter[str] = Counter()
        self._tenant_calls: dict[str, Counter[str]] = {}  # external tenant -> calls per field
        self._lost: Counter[str] = Counter()
        self._down: DownMode | None = None
        self._refusing: int | None = None  # the token endpoint's status while refusing
        self._latency: tuple[float, float] | None = None  # seconds before a call goes on
        self.director_url = ""  # Director's GraphQL endpoint, set before serving
        # URLs `configuration` hands out for certificate-secured calls (none: null).
        self.certificate_secured: ConnectorUrls | None = None
        self.certificate_secured_side: CertificateSecuredGateway | None = None
        self.connector = (
            None
            if tokens is None
            else GatewayConnector(
                tokens,
                request_csr_token=self._request_csr_token,
                urls=lambda: self.certificate_secured,
            )
        )
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._port: int | None = None

    # -- Python API (any thread) -----------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the gateway is not running")
        return f"http://127.0.0.1:{self._port}"

    def remember_tenant(self, external_id: str, internal_id: str) -> None:
        with self._lock:
            self._tenants[external_id] = internal_id

    def lose_answers(
        self,
        operation: str,
        *,
        ratio: float = 1.0,
        count: int | None = None,
        mode: LossMode = "504",
    ) -> None:
        """Director acts on matching calls, their callers get a failure instead of its answer.

        `operation` is a top-level field (`registerRuntime`) or an operation name; `ratio` the
        share of matching calls; `count` how many at most (None: without end). A new rule for
        the same operation replaces the old one.
        """
        rule = LossRule(operation=operation, ratio=ratio, remaining=count, mode=mode)
        with self._lock:
            self._rules = [r for r in self._rules if r.operation != operation] + [rule]

    def clear_faults(self) -> None:
        with self._lock:
            self._rules = []

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._rules]

    def calls(self, tenant: str | None = None) -> dict[str, int]:
        """GraphQL calls passed on to Director, per top-level field (`registerRuntime`); with
        `tenant`, only those sent with that `Tenant` header (an external ID)."""
        with self._lock:
            if tenant is not None:
                return dict(self._tenant_calls.get(tenant, {}))
            return dict(self._calls)

    def lost(self) -> dict[str, int]:
        """Answers lost on purpose, per top-level field."""
        with self._lock:
            return dict(self._lost)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._tenant_calls.clear()
            self._lost.clear()

    def set_down(self, mode: DownMode) -> None:
        """Compass unavailable behind this gateway until `clear_down()`; see the module doc."""
        if mode not in ("refuse", "drop", "503"):
            raise ValueError(f"down must be 'refuse', 'drop' or '503', not {mode!r}")
        with self._lock:
            self._down = mode
        if mode == "refuse" and self._thread is not None:
            self.stop()

    def clear_down(self) -> None:
        with self._lock:
            mode, self._down = self._down, None
        if mode == "refuse" and self._thread is None and self._port is not None:
            self.start(port=self._port)

    @property
    def down(self) -> DownMode | None:
        with self._lock:
            return self._down

    def refuse_credentials(self, status: int = 401) -> None:
        """The token endpoint refuses the client's credentials with `status` and
        `{"error": "invalid_client"}`, and every access token issued so far is revoked (Director's
        front door answers it 401), until `accept_credentials()`."""
        if not 400 <= status < 500:
            raise ValueError(f"a refusal is a 4xx status, not {status}")
        with self._lock:
            self._refusing = status
            self._tokens.clear()
            self._jwts.clear()

    def accept_credentials(self) -> None:
        """The same credentials get tokens again; tokens revoked meanwhile stay revoked."""
        with self._lock:
            self._refusing = None

    @property
    def refusing_credentials(self) -> int | None:
        with self._lock:
            return self._refusing

    def set_latency(self, seconds_min: float | None, seconds_max: float | None = None) -> None:
        """Each `/director/graphql` call waits a uniform random time within
        [`seconds_min`, `seconds_max`] (`seconds_max` None: exactly `seconds_min`) before it is
        passed on to Director; `set_latency(None)` clears it."""
        if seconds_min is None:
            latency = None
        else:
            high = seconds_min if seconds_max is None else seconds_max
            if not 0 <= seconds_min <= high:
                raise ValueError(f"latency wants 0 <= min <= max, not {seconds_min}..{high}")
            latency = (float(seconds_min), float(high))
        with self._lock:
            self._latency = latency

    @property
    def latency(self) -> tuple[float, float] | None:
        with self._lock:
            return self._latency

    def listening(self) -> bool:
        """Whether a connection to the gateway's port is accepted."""
        if self._port is None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", self._port), timeout=1.0):
                return True
        except OSError:
            return False

    def resolve_tenant(self, external: str) -> str | None:
        """The internal ID of a tenant (external ID), from the cache or Director's database."""
        with self._lock:
            known = self._tenants.get(external)
        if known is not None:
            return known
        internal = self._resolve_tenant(external)
        if internal is not None:
            self.remember_tenant(external, internal)
        return internal

    def signing_key(self) -> tuple[rsa.RSAPrivateKey, str]:
        """The key Director verifies JWTs with (its JWKS, `/.well-known/jwks.json`) and its
        key ID: what Oathkeeper's id_token mutator signs with when the real one runs."""
        return self._key, _KEY_ID

    def sign_for_runtime(self, tenant: dict[str, str], runtime_id: str) -> str:
        """A JWT for the runtime itself, as the hydrator makes one for a client certificate."""
        return self._sign(
            tenant,
            RUNTIME_SCOPES,
            runtime_id,
            time.time(),
            consumer_type="Runtime",
            flow="Certificate",
        )

    def start_certificate_secured(self) -> ConnectorUrls:
        """Serves the certificate-secured side (`CertificateSecuredGateway`); from now on the
        Connector's `configuration` hands out its URLs. Needs the Connector (`tokens`)."""
        if self.connector is None:
            raise RuntimeError("the certificate-secured side needs the gateway's Connector")
        if self.certificate_secured_side is None:
            self.certificate_secured_side = CertificateSecuredGateway(self, self.connector)
        self.certificate_secured = self.certificate_secured_side.start()
        return self.certificate_secured

    def stop_certificate_secured(self) -> None:
        side, self.certificate_secured_side = self.certificate_secured_side, None
        self.certificate_secured = None
        if side is not None:
            side.stop()

    def issue_token(self, scopes: tuple[str, ...] | None = None) -> str:
        """An access token as `/oauth2/token` would issue it, without the HTTP round trip
        (also while the credentials are refused: a test's own bearer)."""
        token = self._issue(scopes, unless_refusing=False)
        assert token is not None
        return token

    def _issue(self, scopes: tuple[str, ...] | None, *, unless_refusing: bool) -> str | None:
        chosen = tuple(sorted(scopes if scopes is not None else self._scopes))
        token = secrets.token_urlsafe(32)
        with self._lock:
            # Checked under the lock that `refuse_credentials` revokes under: no token issued
            # after a refusal began outlives it.
            if unless_refusing and self._refusing is not None:
                return None
            self._tokens[token] = _Token(self.client_id, chosen, time.time() + ACCESS_TOKEN_TTL)
        return token

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 15.0, *, port: int = 0) -> None:
        """Serves on `port` (0: a free one) from a thread of its own."""
        if self._thread is not None:
            raise RuntimeError("the gateway is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        # Listen before serving: Director (started next) may fetch the JWKS at once.
        sock.listen(1024)
        sock.setblocking(False)
        self._port = sock.getsockname()[1]
        ready = concurrent.futures.Future[None]()
        self._thread = threading.Thread(
            target=self._thread_main, args=(sock, ready), name="real-director-gateway", daemon=True
        )
        self._thread.start()
        try:
            ready.result(timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        thread, loop, server = self._thread, self._loop, self._server
        if thread is None:
            return
        if loop is not None and server is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(setattr, server, "should_exit", True)
        thread.join(timeout)
        self._thread = None

    def _thread_main(self, sock: socket.socket, ready: concurrent.futures.Future[None]) -> None:
        try:
            asyncio.run(self._serve(sock, ready))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.exception("the gateway stopped with an error")
        finally:
            sock.close()

    async def _serve(self, sock: socket.socket, ready: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._client = httpx.AsyncClient(
            timeout=self._upstream_timeout,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        server = uvicorn.Server(
            uvicorn.Config(
                self,
                http="h11",
                ws="none",
                lifespan="off",
                log_config=None,
                access_log=False,
                server_header=False,
                timeout_graceful_shutdown=2,
            )
        )
        self._server = server
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the gateway stopped during startup")
                await asyncio.sleep(0.005)
            ready.set_result(None)
            await task
        finally:
            await self._client.aclose()

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        body = await _read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        down = self.down
        if down is not None and not path.startswith(_ADMIN + "/"):
            if down == "503":
                await _respond(send, 503, UNAVAILABLE_BODY, content_type="text/plain")
            else:  # drop; refuse while a connection made before it is still open
                await _drop(send)
            return
        if path == GRAPHQL_PATH and method == "POST":
            await self._graphql(headers, body, send)
        elif path == TOKEN_PATH and method == "POST":
            await self._token(headers, body, send)
        elif path == CONNECTOR_PATH and method == "POST" and self.connector is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            # The hydrator takes the token from the header, else from the query parameter.
            token = headers.get("connector-token") or (query.get("token") or [None])[0]
            status, payload = await asyncio.to_thread(self.connector.handle, body, token)
            if payload is None:
                await _respond(send, status, b"", content_type=REFUSED_MEDIA_TYPE)
            else:
                await _respond(send, status, payload)
        elif path == JWKS_PATH and method == "GET":
            await _respond(send, 200, self._jwks)
        elif path.startswith(_ADMIN + "/"):
            await self._admin(path.removeprefix(_ADMIN), method, body, send)
        else:
            await _respond(send, 404, {"error": f"no route {method} {path}"})

    async def _token(self, headers: Mapping[str, str], body: bytes, send: Send) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        client_id, secret = _basic_auth(headers.get("authorization", ""))
        client_id = client_id or form.get("client_id")
        secret = secret or form.get("client_secret")
        refusing = self.refusing_credentials
        if (
            client_id != self.client_id
            or secret is None
            or not secrets.compare_digest(secret, self._client_secret)
            or refusing is not None
        ):
            await _respond(
                send,
                refusing or 401,
                {"error": "invalid_client", "error_description": "Client authentication failed"},
            )
            return
        if form.get("grant_type") != "client_credentials":
            await _respond(send, 400, {"error": "unsupported_grant_type"})
            return
        asked = form.get("scope", "").split()
        refused = [s for s in asked if s not in self._scopes]
        if refused:
            await _respond(
                send,
                400,
                {
                    "error": "invalid_scope",
                    "error_description": f"scope not granted: {' '.join(refused)}",
                },
            )
            return
        scopes = tuple(asked) if asked else tuple(sorted(self._scopes))
        token = self._issue(scopes, unless_refusing=True)
        if token is None:
            await _respond(
                send,
                self.refusing_credentials or 401,
                {"error": "invalid_client", "error_description": "Client authentication failed"},
            )
            return
        await _respond(
            send,
            200,
            {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": ACCESS_TOKEN_TTL,
                "scope": " ".join(scopes),
            },
        )

    def _bearer(self, headers: Mapping[str, str]) -> _Token | None:
        kind, _, value = headers.get("authorization", "").partition(" ")
        if kind.lower() != "bearer" or not value:
            return None
        with self._lock:
            token = self._tokens.get(value.strip())
        if token is None or token.expires_at <= time.time():
            return None
        return token

    async def _internal_tenant(self, external: str) -> str | None:
        with self._lock:
            known = self._tenants.get(external)
        if known is not None:
            return known
        # Not cached: a tenant written to the database by other means. Unknown ones are not
        # cached, so a tenant that appears later is found then.
        internal = await asyncio.to_thread(self._resolve_tenant, external)
        if internal is not None:
            self.remember_tenant(external, internal)
        return internal

    def _jwt_for(self, token: _Token, bearer: str, tenant: dict[str, str]) -> str:
        # Keyed by the internal ID too: a tenant found after a miss must not get the JWT minted
        # for the miss.
        key = (bearer, tenant.get("externalTenant"), tenant.get("consumerTenant"))
        now = time.time()
        with self._lock:
            cached = self._jwts.get(key)
        if cached is not None and cached[1] - now > _JWT_REUSE_MARGIN:
            return cached[0]
        signed = self._sign(tenant, token.scopes, token.client_id, now)
        with self._lock:
            self._jwts[key] = (signed, now + _JWT_TTL)
        return signed

    def _sign(
        self,
        tenant: dict[str, str],
        scopes: tuple[str, ...],
        consumer: str,
        now: float,
        *,
        consumer_type: str = CONSUMER_TYPE,
        flow: str = FLOW,
    ) -> str:
        claims = {
            # Director reads `tenant` as a JSON document inside a string, as the hydrator
            # writes it.
            "tenant": json.dumps(tenant),
            "scopes": " ".join(scopes),
            "consumerID": consumer,
            "consumerType": consumer_type,
            "flow": flow,
            "iat": int(now),
            "exp": int(now) + _JWT_TTL,
        }
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": _KEY_ID})

    def _request_csr_token(self, spent: SpentToken) -> str:
        """What Connector asks Director for: a fresh one-time token on the same SystemAuth, in
        the tenant the first one was requested in. Not counted among the callers' calls."""
        tenant = {"consumerTenant": spent.tenant, "externalTenant": spent.external_tenant}
        signed = self._sign(tenant, ("runtime:write",), "compass-connector", time.time())
        response = httpx.post(
            self.director_url,
            json={"query": _CSR_MUTATION, "variables": {"auth": spent.system_auth_id}},
            headers={"authorization": f"Bearer {signed}"},
            timeout=self._upstream_timeout,
        )
        response.raise_for_status()
        body = response.json()
        if body.get("errors"):
            raise ValueError(body["errors"][0].get("message", "Director refused"))
        return str(body["data"]["result"]["token"])

    def _count(
        self, fields: tuple[str, ...], name: str | None, tenant: str | None = None
    ) -> LossMode | None:
        """Counts the call per top-level field and says whether (and how) its answer is lost."""
        with self._lock:
            by_tenant = self._tenant_calls.setdefault(tenant or "", Counter())
            for field in fields or ("(unparsed)",):
                self._calls[field] += 1
                by_tenant[field] += 1
            for rule in self._rules:
                if rule.operation not in fields and rule.operation != name:
                    continue
                if rule.remaining == 0 or self._rng.random() >= rule.ratio:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                for field in fields:
                    self._lost[field] += 1
                return rule.mode
        return None

    async def _graphql(self, headers: Mapping[str, str], body: bytes, send: Send) -> None:
        token = self._bearer(headers)
        if token is None:
            await _respond(
                send,
                401,
                {
                    "error": {
                        "code": 401,
                        "status": "Unauthorized",
                        "message": "Access credentials are invalid",
                    }
                },
            )
            return
        bearer = headers["authorization"].partition(" ")[2].strip()
        tenant: dict[str, str] = {}
        external = headers.get("tenant")
        if external:
            tenant["externalTenant"] = external
            internal = await self._internal_tenant(external)
            if internal is not None:
                tenant["consumerTenant"] = internal
        try:
            request = json.loads(body)
            fields, name = _operations_of(
                str(request.get("query", "")), request.get("operationName")
            )
        except (ValueError, AttributeError):
            fields, name = (), None
        loss = self._count(fields, name, external)
        forward = {
            "authorization": f"Bearer {self._jwt_for(token, bearer, tenant)}",
            "content-type": headers.get("content-type", "application/json"),
        }
        latency = self.latency
        if latency is not None:
            await asyncio.sleep(self._rng.uniform(*latency))
        assert self._client is not None
        try:
            upstream = await self._client.post(self.director_url, content=body, headers=forward)
        except httpx.TimeoutException:
            await _respond(send, 504, b"upstream request timeout", content_type="text/plain")
            return
        except httpx.TransportError as exc:
            log.warning("Director unreachable: %r", exc)
            await _respond(
                send,
                502,
                b"upstream connect error or disconnect/reset before headers",
                content_type="text/plain",
            )
            return
        if loss == "drop":
            await _drop(send)
            return
        if loss == "504":
            await _respond(send, 504, b"upstream request timeout", content_type="text/plain")
            return
        await _respond(
            send,
            upstream.status_code,
            upstream.content,
            content_type=upstream.headers.get("content-type", "application/json"),
        )

    async def _admin(self, path: str, method: str, body: bytes, send: Send) -> None:
        if path == "/calls" and method == "GET":
            await _respond(send, 200, {"calls": self.calls(), "lost": self.lost()})
        elif path == "/calls" and method == "DELETE":
            self.reset_calls()
            await _respond(send, 204, b"")
        elif path == "/faults" and method == "GET":
            await _respond(send, 200, {"lose_answers": self.faults()})
        elif path == "/faults" and method == "DELETE":
            self.clear_faults()
            await _respond(send, 204, b"")
        elif path == "/down" and method == "PUT":
            try:
                mode = json.loads(body)["mode"]
                if mode not in ("drop", "503"):  # refuse would take this admin API down too
                    raise ValueError(f"mode {mode!r}")
            except (ValueError, KeyError, TypeError) as exc:
                await _respond(
                    send, 400, {"error": f'bad down: {exc!r}; expected {{"mode": "503"|"drop"}}'}
                )
                return
            self.set_down(mode)
            await _respond(send, 200, {"down": mode})
        elif path == "/down" and method == "DELETE":
            self.clear_down()
            await _respond(send, 204, b"")
        elif path == "/credentials" and method == "PUT":
            try:
                self.refuse_credentials(int((json.loads(body or b"{}") or {}).get("status", 401)))
            except (ValueError, TypeError, AttributeError) as exc:
                await _respond(
                    send,
                    400,
                    {"error": f"bad refusal: {exc!r}; expected a JSON object with status"},
                )
                return
            await _respond(send, 200, {"refusing": self.refusing_credentials})
        elif path == "/credentials" and method == "DELETE":
            self.accept_credentials()
            await _respond(send, 204, b"")
        elif path == "/latency" and method == "PUT":
            try:
                doc = json.loads(body)
                self.set_latency(float(doc["min"]), float(doc.get("max", doc["min"])))
            except (ValueError, KeyError, TypeError) as exc:
                await _respond(
                    send,
                    400,
                    {"error": f"bad latency: {exc!r}; expected a JSON object with min, max"},
                )
                return
            await _respond(send, 200, {"latency": self.latency})
        elif path == "/latency" and method == "DELETE":
            self.set_latency(None)
            await _respond(send, 204, b"")
        elif path == "/faults" and method == "PUT":
            try:
                doc = json.loads(body)
                self.lose_answers(
                    str(doc["operation"]),
                    ratio=float(doc.get("ratio", 1.0)),
                    count=None if doc.get("count") is None else int(doc["count"]),
                    mode=doc.get("mode", "504"),
                )
            except (ValueError, KeyError, TypeError) as exc:
                await _respond(
                    send,
                    400,
                    {
                        "error": f"bad fault: {exc!r}; expected "
                        '{"operation": "registerRuntime", "ratio": 0.3, "count": null, '
                        '"mode": "504"|"drop"}'
                    },
                )
                return
            await _respond(send, 200, {"lose_answers": self.faults()})
        else:
            await _respond(send, 404, {"error": f"no admin route {method} {path}"})


class CertificateSecuredGateway:
    """The certificate-secured side of Compass, in front of the real Director: what a runtime
    talks to with the client certificate the gateway's Connector issued (mutual TLS; only
    that CA's certificates pass the handshake).

    - `/connector/graphql`: Connector authenticated by the certificate (its CN is the
      SystemAuth ID): `configuration` (the connection check of compass-runtime-agent; a CSR
      token from Director again) and `signCertificateSigningRequest` (renewal);
    - `/director/graphql`: Director for the runtime itself, as Oathkeeper and the hydrator
      pass a certificate on: the CN's SystemAuth names the runtime, whose ID becomes the JWT's
      consumer (type `Runtime`, flow `Certificate`), in the SystemAuth's tenant (the `Tenant`
      header is not trusted), with a runtime's scopes (its runtime, applications, labels).

    Served by a `ThreadingHTTPServer` of its own (uvicorn does not hand the peer certificate
    to the app). Faults of the gateway do not reach it: an established runtime keeps its
    channel, as in the simulator. Calls are counted per top-level field (`calls()`), apart
    from the callers' calls of the gateway.
    """

    def __init__(self, gateway: Gateway, connector: GatewayConnector) -> None:
        self._gateway = gateway
        self._connector = connector
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._http = httpx.Client(timeout=60.0)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the certificate-secured gateway is not running")
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def urls(self) -> ConnectorUrls:
        return ConnectorUrls(
            director=f"{self.url}{GRAPHQL_PATH}",
            certificate_secured_connector=f"{self.url}{CONNECTOR_PATH}",
        )

    def calls(self) -> dict[str, int]:
        with self._lock:
            return dict(self._calls)

    def start(self) -> ConnectorUrls:
        if self._server is not None:
            return self.urls()
        server_ca = pki.new_ca("real-director gateway mTLS server CA")
        server_cert = pki.issue(
            server_ca, common_name="real-director-gateway", server_hosts=("127.0.0.1", "localhost")
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_bytes(server_cert.cert_pem + server_ca.cert_pem)
            key.write_bytes(server_cert.key_pem)
            context.load_cert_chain(cert, key)
        context.load_verify_locations(cadata=self._connector.ca.certificate_pem.decode())
        context.verify_mode = ssl.CERT_REQUIRED
        server = ThreadingHTTPServer(("127.0.0.1", 0), _mtls_handler(self))
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="real-director-gateway-mtls", daemon=True
        )
        self._thread.start()
        return self.urls()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(10)
        self._server = None
        self._thread = None
        self._http.close()

    def handle(self, path: str, body: bytes, certificate_cn: str) -> tuple[int, bytes]:
        fields: tuple[str, ...] = ()
        with contextlib.suppress(ValueError, AttributeError):
            request = json.loads(body)
            fields, _ = _operations_of(str(request.get("query", "")), request.get("operationName"))
        with self._lock:
            self._calls.update(fields or ("(unparsed)",))
        if path == CONNECTOR_PATH:
            status, payload = self._connector.handle(body, None, certificate_cn=certificate_cn)
            return status, b"" if payload is None else json.dumps(payload).encode()
        if path == GRAPHQL_PATH:
            return self._director(body, certificate_cn)
        return 404, json.dumps({"errors": [{"message": f"no endpoint at {path}"}]}).encode()

    def _director(self, body: bytes, certificate_cn: str) -> tuple[int, bytes]:
        caller = self._connector.system_auth(certificate_cn)
        if caller is None:
            return 401, json.dumps(
                {"error": {"code": 401, "status": "Unauthorized", "message": "unknown client"}}
            ).encode()
        # The tenant is the SystemAuth's (where the runtime's token was asked for), not what
        # the caller's `Tenant` header claims.
        claims_tenant = {
            "consumerTenant": caller.tenant,
            "externalTenant": caller.external_tenant,
        }
        signed = self._gateway.sign_for_runtime(claims_tenant, caller.runtime_id)
        try:
            upstream = self._http.post(
                self._gateway.director_url,
                content=body,
                headers={"authorization": f"Bearer {signed}", "content-type": "application/json"},
            )
        except httpx.HTTPError:
            return 502, b'{"errors": [{"message": "Director unreachable"}]}'
        return upstream.status_code, upstream.content


def _mtls_handler(side: CertificateSecuredGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Go's client expects

        def do_POST(self) -> None:
            assert isinstance(self.connection, ssl.SSLSocket)
            der = self.connection.getpeercert(binary_form=True)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            common_name = _common_name(der)
            if common_name is None:
                self._answer(401, b'{"errors": [{"message": "client certificate without a CN"}]}')
                return
            status, payload = side.handle(self.path.split("?", 1)[0], body, common_name)
            self._answer(status, payload)

        def _answer(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("mtls: " + format, *args)

    return Handler


def _common_name(der: bytes | None) -> str | None:
    if not der:
        return None
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else None
    return value if isinstance(value, str) and value else None


def _basic_auth(header: str) -> tuple[str | None, str | None]:
    kind, _, value = header.partition(" ")
    if kind.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _respond(
    send: Send,
    status: int,
    body: bytes | Mapping[str, Any],
    *,
    content_type: str = "application/json",
) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def _drop(send: Send) -> None:
    """Closes the connection without an answer."""
    # uvicorn's `send` is a bound method of the request cycle that owns the transport.
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is not None:
        transport.abort()
        # Let the server see the connection gone before the app returns, so it does not
        # answer with a 500 of its own.
        for _ in range(3):
            await asyncio.sleep(0)
        return
    # Another server: promise a body and never send it; the server closes the connection.
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]}
    )


def new_client_credentials() -> tuple[str, str]:
    """(client_id, client_secret): the ID is a UUID, as Compass's integration-system clients'."""
    return str(uuid.uuid4()), secrets.token_urlsafe(24)
