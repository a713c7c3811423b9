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
- `/_gateway/calls` (GET, DELETE) and `/_gateway/faults` (GET, PUT, DELETE): counters and fault
  injection for a stack run as a separate process (`python -m devenv.real_director`).

A lost answer is produced *after* Director answered, so Director has acted and committed: the
caller then gets what Compass's Istio ingress (Envoy) sends when its upstream times out,
`504` with the body `upstream request timeout`, or, in mode `drop`, a connection closed without
an answer (a load balancer or proxy restarting mid-request).

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
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

import httpx
import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from graphql import FieldNode, GraphQLError, OperationDefinitionNode, parse

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
LossMode = Literal["504", "drop"]
TenantResolver = Callable[[str], str | None]

# The flow and consumer type the hydrator puts in the token of an OAuth client that belongs
# to an integration system: Director then treats the caller as the Kyma provisioning client
# (adds `runtimeType: kyma`, `region`, ...), as compass-manager's client is treated in Compass.
FLOW = "OAuth2"
CONSUMER_TYPE = "Integration System"
DEFAULT_SCOPES = frozenset({"runtime:read", "runtime:write"})
ACCESS_TOKEN_TTL = 3600
# Director checks `exp`; a token is reused until this close to it, so the gateway signs about
# once a minute per (client token, tenant), not once per request.
_JWT_TTL = 300
_JWT_REUSE_MARGIN = 60
_KEY_ID = "real-director-gateway"
_ADMIN = "/_gateway"
GRAPHQL_PATH = "/director/graphql"
TOKEN_PATH = "/oauth2/token"  # noqa: S105 - a path, not a secret
JWKS_PATH = "/.well-known/jwks.json"


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
        self._lost: Counter[str] = Counter()
        self.director_url = ""  # Director's GraphQL endpoint, set before serving
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

    def calls(self) -> dict[str, int]:
        """GraphQL calls passed on to Director, per top-level field (`registerRuntime`)."""
        with self._lock:
            return dict(self._calls)

    def lost(self) -> dict[str, int]:
        """Answers lost on purpose, per top-level field."""
        with self._lock:
            return dict(self._lost)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._lost.clear()

    def issue_token(self, scopes: tuple[str, ...] | None = None) -> str:
        """An access token as `/oauth2/token` would issue it, without the HTTP round trip."""
        chosen = tuple(sorted(scopes if scopes is not None else self._scopes))
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = _Token(self.client_id, chosen, time.time() + ACCESS_TOKEN_TTL)
        return token

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        if self._thread is not None:
            raise RuntimeError("the gateway is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
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
        if path == GRAPHQL_PATH and method == "POST":
            await self._graphql(headers, body, send)
        elif path == TOKEN_PATH and method == "POST":
            await self._token(headers, body, send)
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
        if (
            client_id != self.client_id
            or secret is None
            or not secrets.compare_digest(secret, self._client_secret)
        ):
            await _respond(
                send,
                401,
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
        token = self.issue_token(scopes)
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
        claims = {
            # Director reads `tenant` as a JSON document inside a string, as the hydrator
            # writes it.
            "tenant": json.dumps(tenant),
            "scopes": " ".join(token.scopes),
            "consumerID": token.client_id,
            "consumerType": CONSUMER_TYPE,
            "flow": FLOW,
            "iat": int(now),
            "exp": int(now) + _JWT_TTL,
        }
        signed = jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": _KEY_ID})
        with self._lock:
            self._jwts[key] = (signed, now + _JWT_TTL)
        return signed

    def _count(self, fields: tuple[str, ...], name: str | None) -> LossMode | None:
        """Counts the call per top-level field and says whether (and how) its answer is lost."""
        with self._lock:
            for field in fields or ("(unparsed)",):
                self._calls[field] += 1
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
        loss = self._count(fields, name)
        forward = {
            "authorization": f"Bearer {self._jwt_for(token, bearer, tenant)}",
            "content-type": headers.get("content-type", "application/json"),
        }
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
