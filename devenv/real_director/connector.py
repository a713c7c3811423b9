"""The real Compass Connector, hydrator and ORY Oathkeeper next to the real Director.

    token path:    caller ── Connector-Token ──▶ Oathkeeper /connector/graphql
                     hydrator tokens/resolve (Director spends the token), tenant-mapping,
                     id_token ──▶ Connector ── /director-internal ──▶ Director (CSR token)
    certificate    runtime ── mTLS ──▶ front (ours, Istio's part) ── Certificate-Data ──▶
    secured side:    Oathkeeper /mtls/connector/graphql, /mtls/director/graphql
                     hydrator certificate/data/resolve, tenant-mapping, id_token
                     ──▶ Connector or Director

Everything is Compass's own code at the pinned commit (Connector, hydrator; Director's
configuration file as the chart extends it) and Oathkeeper at the version Compass's chart ran,
with access rules written here from what the chart's rules do (`access_rules`). Stand-ins that
remain, each for a reason (docs/real-compass.md):

- Hydra: the gateway's token endpoint and Director path (stack.py), for the broker's OAuth client;
- Istio's mTLS ingress: `CertificateSecuredFront`, a TLS listener on loopback that verifies the
  client certificate against the Connector's CA and sets `Certificate-Data` as Istio does;
- the Kubernetes ServiceAccount token Connector and hydrator send to Director (read from the fixed
  in-pod path, which no setting changes) and the JWKS Oathkeeper verifies it with: a key made here.

Connector and hydrator read `/var/run/secrets/kubernetes.io/serviceaccount/token` on every
Director call. Outside a pod each runs in a private mount namespace (`unshare -m`, a tmpfs on
`/run` holding that token): root and unshare(1) are needed, and nothing on the host changes.
Without `KUBERNETES_SERVICE_HOST` both fall back to a kubeconfig (hydrator `$HOME/.kube/config`,
Connector `$HOME/.kube/Config`), which points at the stack's test API server, where the
Connector's CA Secret and both revocation ConfigMaps live in the stack's namespace.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv import pki
from devenv.clusters import TestCluster, terminate

from . import build_scripts

log = logging.getLogger(__name__)

BUILD_SCRIPT = Path(__file__).resolve().parent / "build-connector.sh"
OATHKEEPER_VERSION = "v0.40.6"  # build-connector.sh pins the same

# The subject Connector puts before CN=<SystemAuth ID>, and the hydrator requires of a
# certificate the Connector issued: both get the same values (Compass's defaults).
CSR_SUBJECT = {
    "COUNTRY": "PL",
    "ORGANIZATION": "Org",
    "ORGANIZATIONAL_UNIT": "OrgUnit",
    "LOCALITY": "Locality",
    "PROVINCE": "State",
}
CERTIFICATE_VALIDITY = "2160h"  # Connector's default: 90 days
CA_SECRET = "connector-ca"  # noqa: S105 - a Secret's name
REVOCATIONS_CONFIG_MAP = "revocations-config"
SERVICE_ACCOUNT_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105
# What the Connector and the hydrator ask Director for through the internal rule, and the
# scopes Director then demands (its configuration file, below): the hydrator reads and spends
# one-time tokens and reads SystemAuths and tenants; Connector asks for the CSR token.
INTERNAL_SCOPES = (
    "ory_internal",
    "tenant:read",
    "runtime:read",
    "runtime:write",
    "application:read",
    "runtime.auths:read",
    "application.auths:read",
    "integration_system.auths:read",
    "certificate_subject_mapping:read",
)
# Director's configuration file as Compass's chart extends the local one for the hydrator:
# the operations only internal callers use, and the scopes per consumer type the hydrator hands
# a runtime (one-time token and certificate flows).
DIRECTOR_CONFIG_QUERIES = {
    "systemAuth": ["ory_internal"],
    "systemAuthByToken": ["ory_internal"],
    "tenantByInternalID": ["ory_internal"],
    "tenantByLowestOwnerForResource": ["ory_internal"],
}
DIRECTOR_CONFIG_MUTATIONS = {
    "updateSystemAuth": ["ory_internal"],
    "invalidateSystemAuthOneTimeToken": ["ory_internal"],
}
RUNTIME_SCOPES = [
    "runtime:read",
    "runtime:write",
    "application:read",
    "runtime.auths:read",
    "bundle.instance_auths:read",
    "runtime.webhooks:read",
    "webhook:write",
]
_READY_TIMEOUT = 60.0
_RESOLVED = re.compile(r"Token for ([0-9a-f-]{36}) resolved successfully")


class ConnectorUnavailable(RuntimeError):
    """The real Connector cannot run here; the message says why (tests skip with it)."""

    def __init__(self, reason: str, *, source_missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.source_missing = source_missing


def why_not_here() -> str | None:
    """Why Connector and hydrator cannot run on this machine, or None."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return (
            "the real Connector and hydrator read a ServiceAccount token at a fixed in-pod path: "
            "outside a pod they need root and unshare(1) (a private mount namespace)"
        )
    return None


def find_connector() -> tuple[Path | None, str]:
    """(the folder with connector, hydrator and oathkeeper when built, or where the sources
    would come from; "") or (None, why not), building nothing."""
    return build_scripts.find_source(BUILD_SCRIPT)


def build_connector() -> Path:
    """The folder holding `connector`, `hydrator` and `oathkeeper-<version>/oathkeeper`, built
    once (progress to our stderr). Raises ConnectorUnavailable(source_missing=True) when a
    source cannot be had."""
    built = build_scripts.build(BUILD_SCRIPT)
    if built.code == build_scripts.EXIT_NO_SOURCE:
        raise ConnectorUnavailable(built.reason, source_missing=True)
    if built.code != 0 or not built.folder:
        raise ConnectorUnavailable(f"{BUILD_SCRIPT} failed (exit {built.code}): {built.reason}")
    return Path(built.folder)


# -- Director's configuration file ---------------------------------------------------------


def director_configuration(local: Path, target: Path) -> Path:
    """`local` (the tree's hack/config-local.yaml) with what the hydrator needs, at `target`;
    Director and the hydrator both read it."""
    document = yaml.safe_load(local.read_text())
    graphql = document.setdefault("graphql", {})
    graphql.setdefault("query", {}).update(DIRECTOR_CONFIG_QUERIES)
    graphql.setdefault("mutation", {}).update(DIRECTOR_CONFIG_MUTATIONS)
    document["scopesPerConsumerType"] = {
        "runtime": RUNTIME_SCOPES,
        "application": document.get("clientCredentialsRegistrationScopes", {}).get(
            "application", []
        ),
        "integration_system": document.get("clientCredentialsRegistrationScopes", {}).get(
            "integration_system", []
        ),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(document, sort_keys=False))
    return target


# -- Oathkeeper: configuration and access rules ---------------------------------------------

# The claims Director reads (pkg/idtokenclaims), from what the hydrator's tenant-mapping put in
# the session's extra: `tenant` arrives as JSON with its quotes escaped, so it renders as a JSON
# string holding JSON. Without a resolved token or certificate the extra is empty, every value
# renders as "<no value>", and Connector refuses the unparsable tenant with HTTP 400.
_CLAIMS = {
    "tenant": "{{ print .Extra.tenant }}",
    "scopes": "{{ print .Extra.scope }}",
    "consumerID": "{{ print .Extra.consumerID }}",
    "consumerType": "{{ print .Extra.consumerType }}",
    "flow": "{{ print .Extra.flow }}",
    "onBehalfOf": "{{ print .Extra.onBehalfOf }}",
    "region": "{{ print .Extra.region }}",
    "tokenClientID": "{{ print .Extra.tokenClientID }}",
    "subject": "{{ print .Extra.subject }}",
}
# Internal callers (hydrator, Connector): Director's internal scopes, and the consumer tenant
# the caller names in its `Tenant` header (Connector sends the internal ID it was given).
_INTERNAL_TENANT = (
    '{ {{ if .MatchContext.Header.Tenant }}"consumerTenant":"'
    '{{ index .MatchContext.Header.Tenant 0 }}", {{ end }}"externalTenant":""}'
)


def _claims_template(claims: Mapping[str, str]) -> str:
    """A JSON object whose values are Go templates, as the id_token mutator takes it."""
    return json.dumps(dict(claims))


@dataclass(frozen=True)
class Ports:
    oathkeeper: int
    oathkeeper_api: int
    oathkeeper_metrics: int
    hydrator: int
    hydrator_metrics: int
    connector: int
    front: int


class ReservedPorts:
    """Free loopback ports, each held by a bound socket until its process is about to listen
    on it: Oathkeeper's port goes into Director's configuration long before Oathkeeper starts,
    and on a busy machine a port merely found free is soon someone's (a client's ephemeral
    port, another test's listener)."""

    def __init__(self) -> None:
        self._held: dict[str, socket.socket] = {}
        numbers: dict[str, int] = {}
        for spec in fields(Ports):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            self._held[spec.name] = sock
            numbers[spec.name] = sock.getsockname()[1]
        self.ports = Ports(**numbers)

    def release(self, *names: str) -> None:
        for name in names:
            sock = self._held.pop(name, None)
            if sock is not None:
                sock.close()

    def close(self) -> None:
        self.release(*list(self._held))


def access_rules(ports: Ports, director_port: int) -> list[dict[str, Any]]:
    """Compass's Oathkeeper rules for the paths the Kyma flows use, on loopback.

    - `/connector/graphql`: the one-time token (header `Connector-Token`) becomes the client ID
      (hydrator `tokens/resolve` spends it at Director), then tenant and scopes (hydrator
      `tenant-mapping`), then a JWT; Connector gets the request without the prefix.
    - `/director-internal/...`: what hydrator and Connector call Director with, authenticated
      by their ServiceAccount token (jwt) or not at all (noop), with the internal claims.
    - `/mtls/connector/graphql`, `/mtls/director/graphql`: what the certificate-secured front
      passes on with `Certificate-Data` (hydrator `certificate/data/resolve` names the client).
    """
    hydrator = f"http://127.0.0.1:{ports.hydrator}/hydrators"

    def hydrate(path: str) -> dict[str, Any]:
        return {"handler": "hydrator", "config": {"api": {"url": f"{hydrator}{path}"}}}

    id_token = {"handler": "id_token", "config": {"claims": _claims_template(_CLAIMS)}}
    host = "<[^/]+>"
    connector = f"http://127.0.0.1:{ports.connector}"
    director = f"http://127.0.0.1:{director_port}"
    methods = ["GET", "POST", "OPTIONS"]

    def rule(rule_id: str, path: str, upstream: str, strip: str, first: str) -> dict[str, Any]:
        return {
            "id": rule_id,
            "match": {"url": f"<http|https>://{host}{path}", "methods": methods},
            "upstream": {"url": upstream, "strip_path": strip, "preserve_host": False},
            "authenticators": [{"handler": "noop"}],
            "authorizer": {"handler": "allow"},
            "mutators": [hydrate(first), hydrate("/tenant-mapping"), id_token],
        }

    internal_claims = {
        "tenant": _INTERNAL_TENANT,
        "scopes": " ".join(INTERNAL_SCOPES),
        "consumerType": "Internal Component",
        "flow": "Internal",
    }
    return [
        rule(
            "connector-one-time-token",
            "/connector/graphql",
            connector,
            "/connector",
            "/v1/tokens/resolve",
        ),
        rule(
            "connector-certificate",
            "/mtls/connector/graphql",
            connector,
            "/mtls/connector",
            "/v1/certificate/data/resolve",
        ),
        rule(
            "director-certificate",
            "/mtls/director/graphql",
            director,
            "/mtls/director",
            "/v1/certificate/data/resolve",
        ),
        {
            "id": "director-internal",
            "match": {"url": f"<http|https>://{host}/director-internal/<.*>", "methods": methods},
            "upstream": {"url": director, "strip_path": "/director-internal"},
            "authenticators": [{"handler": "jwt"}, {"handler": "noop"}],
            "authorizer": {"handler": "allow"},
            "mutators": [
                {"handler": "id_token", "config": {"claims": _claims_template(internal_claims)}}
            ],
        },
    ]


def oathkeeper_config(
    ports: Ports,
    *,
    rules_file: Path,
    service_account_jwks: Path,
    signing_jwks: Path,
    issuer: str,
    service_account_issuer: str,
) -> dict[str, Any]:
    return {
        "serve": {
            "proxy": {"host": "127.0.0.1", "port": ports.oathkeeper},
            "api": {"host": "127.0.0.1", "port": ports.oathkeeper_api},
            # Its default is every interface, port 9000: loopback and a port of its own.
            "prometheus": {"host": "127.0.0.1", "port": ports.oathkeeper_metrics},
        },
        "access_rules": {
            "repositories": [rules_file.as_uri()],
            "matching_strategy": "regexp",
        },
        "authenticators": {
            "noop": {"enabled": True},
            "jwt": {
                "enabled": True,
                "config": {
                    "jwks_urls": [service_account_jwks.as_uri()],
                    "trusted_issuers": [service_account_issuer],
                },
            },
        },
        "authorizers": {"allow": {"enabled": True}},
        "mutators": {
            "noop": {"enabled": True},
            "hydrator": {
                "enabled": True,
                "config": {"api": {"url": f"http://127.0.0.1:{ports.hydrator}/hydrators"}},
            },
            "id_token": {
                "enabled": True,
                "config": {"issuer_url": issuer, "jwks_url": signing_jwks.as_uri(), "ttl": "5m"},
            },
        },
        "log": {"level": "info", "format": "text"},
    }


# -- the ServiceAccount token stand-in -------------------------------------------------------


@dataclass
class ServiceAccountStandIn:
    """A key that signs the ServiceAccount tokens Connector and hydrator present to Director's
    internal rule, and its public JWKS for Oathkeeper's jwt authenticator."""

    issuer: str = "https://kubernetes.default.svc.cluster.local"
    key: rsa.RSAPrivateKey = field(default_factory=pki.new_rsa_key)
    kid: str = field(default_factory=lambda: uuid.uuid4().hex)

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def token(self, name: str, namespace: str = "compass-system") -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{namespace}:{name}",
            "aud": [self.issuer],
            "iat": now,
            "nbf": now,
            "exp": now + 30 * 24 * 3600,
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


def private_jwks(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    """A JWKS holding the private key (Oathkeeper's id_token mutator signs with it)."""
    private = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {"keys": [{**private, "kid": kid, "alg": "RS256", "use": "sig"}]}


# -- processes -------------------------------------------------------------------------------


@dataclass
class _Process:
    name: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate(proc, timeout=timeout)


def _start(
    name: str,
    argv: list[str],
    env: Mapping[str, str],
    workdir: Path,
    *,
    service_account_token: Path | None = None,
) -> _Process:
    """Starts `argv` with its output in `<workdir>/<name>.log`; with a token file, in a private
    mount namespace whose /run holds it at the in-pod path."""
    if service_account_token is not None:
        run = os.path.realpath("/var/run")
        inside = SERVICE_ACCOUNT_TOKEN_DIR.replace("/var/run", run, 1)
        script = (
            f"mount -t tmpfs -o size=1m,mode=755 compass-serviceaccount {run}"
            f' && mkdir -p {inside} && cat "$SERVICE_ACCOUNT_TOKEN_FILE" > {inside}/token'
            ' && unset SERVICE_ACCOUNT_TOKEN_FILE && exec "$0" "$@"'
        )
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, *argv]
        env = {**env, "SERVICE_ACCOUNT_TOKEN_FILE": str(service_account_token)}
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=str(workdir),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return _Process(name, log_path, proc)


def _wait_ready(process: _Process, url: str, timeout: float = _READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=2.0) as http:
        while True:
            if not process.running:
                raise ConnectorUnavailable(
                    f"{process.name} exited during start:\n{_tail(process.log_path)}"
                )
            try:
                response = http.get(url)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise ConnectorUnavailable(
                    f"{process.name} not ready after {timeout:g}s ({last}):\n"
                    f"{_tail(process.log_path)}"
                )
            time.sleep(0.05)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _base_env(home: Path) -> dict[str, str]:
    # No KUBERNETES_SERVICE_HOST: both components then use the kubeconfig in HOME.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}


# -- Istio's part: the certificate-secured front ---------------------------------------------


def certificate_data(der: bytes) -> str:
    """The header Istio's ingress sets for a verified client certificate (what the hydrator's
    certificate resolver parses): its SHA-256 and its subject, RFC 4514 order as Envoy writes
    it."""
    certificate = x509.load_der_x509_certificate(der)
    digest = hashlib.sha256(der).hexdigest()
    return f'Hash={digest};Subject="{certificate.subject.rfc4514_string()}"'


class CertificateSecuredFront:
    """The mutual-TLS listener Istio's ingress is in Compass, on loopback: only certificates of
    the Connector's CA pass the handshake; `/connector/graphql` and `/director/graphql` go to
    Oathkeeper's `/mtls/...` rules with `Certificate-Data` set (a client's own is dropped).
    Counts calls per path (`calls()`)."""

    def __init__(self, port: int, ca_pem: bytes, oathkeeper_url: str) -> None:
        self._port = port
        self._ca_pem = ca_pem
        self._oathkeeper = oathkeeper_url
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._http = httpx.Client(timeout=60.0)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._port}"

    def calls(self) -> dict[str, int]:
        with self._lock:
            return dict(self._calls)

    def start(self) -> None:
        server_ca = pki.new_ca("real-connector mTLS front CA")
        server_cert = pki.issue(
            server_ca, common_name="compass-gateway-mtls", server_hosts=("127.0.0.1", "localhost")
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_bytes(server_cert.cert_pem + server_ca.cert_pem)
            key.write_bytes(server_cert.key_pem)
            context.load_cert_chain(cert, key)
        context.load_verify_locations(cadata=self._ca_pem.decode())
        context.verify_mode = ssl.CERT_REQUIRED
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _front_handler(self))
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="real-connector-mtls-front", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(10)
        self._http.close()

    def forward(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, der: bytes
    ) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        with self._lock:
            self._calls[route] += 1
        if route not in ("/connector/graphql", "/director/graphql"):
            return 404, "text/plain", b"route not found"
        skip = {"host", "content-length", "connection", "certificate-data", "transfer-encoding"}
        sent = {k: v for k, v in headers.items() if k.lower() not in skip}
        sent["Certificate-Data"] = certificate_data(der)
        sent["X-Forwarded-Proto"] = "https"
        try:
            upstream = self._http.request(
                method, f"{self._oathkeeper}/mtls{path}", headers=sent, content=body
            )
        except httpx.HTTPError:
            return 503, "text/plain", b"no healthy upstream"
        return (
            upstream.status_code,
            upstream.headers.get("content-type", "application/json"),
            upstream.content,
        )


def _front_handler(front: CertificateSecuredFront) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Go's client expects

        def _handle(self) -> None:
            assert isinstance(self.connection, ssl.SSLSocket)
            der = self.connection.getpeercert(binary_form=True) or b""
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, content_type, payload = front.forward(
                self.command, self.path, dict(self.headers.items()), body, der
            )
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _handle
        do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("mtls front: " + format, *args)

    return Handler


# -- the whole of it -------------------------------------------------------------------------


@dataclass
class RealConnector:
    """Oathkeeper, hydrator, Connector and the certificate-secured front, running."""

    workdir: Path
    ports: Ports
    ca: pki.KeyPair
    processes: list[_Process] = field(default_factory=list)
    front: CertificateSecuredFront | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The token-secured Connector (Oathkeeper's rule): what a one-time token's
        `connectorURL` names."""
        return connector_url(self.ports)

    @property
    def oathkeeper_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.oathkeeper}"

    @property
    def certificate_secured_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.front}"

    @property
    def certificate_secured_connector_url(self) -> str:
        return f"{self.certificate_secured_url}/connector/graphql"

    @property
    def certificate_secured_director_url(self) -> str:
        return f"{self.certificate_secured_url}/director/graphql"

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem

    @property
    def running(self) -> bool:
        return bool(self.processes) and all(p.running for p in self.processes)

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.processes if p.pid is not None}

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def resolved_tokens(self) -> list[str]:
        """The SystemAuth IDs of every token the hydrator resolved (and Director spent), in
        order, from the hydrator's log: one per successful `tokens/resolve`."""
        try:
            text = self.log("hydrator").read_text(errors="replace")
        except OSError:
            return []
        return _RESOLVED.findall(text)

    def stop(self) -> None:
        errors: list[BaseException] = []
        if self.front is not None:
            try:
                self.front.stop()
            except Exception as exc:  # every part gets its turn
                errors.append(exc)
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise ConnectorUnavailable(f"stopping the real Connector: {errors!r}")


def connector_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.oathkeeper}/connector/graphql"


def _prepare_cluster(cluster: TestCluster, namespace: str, ca: pki.KeyPair) -> None:
    objects: list[client.V1ConfigMap | client.V1Secret] = [
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=CA_SECRET),
            data={
                "ca.crt": base64.b64encode(ca.cert_pem).decode(),
                "ca.key": base64.b64encode(ca.key_pem).decode(),
            },
        ),
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=REVOCATIONS_CONFIG_MAP), data={}),
    ]
    for obj in objects:
        try:
            if isinstance(obj, client.V1ConfigMap):
                cluster.core.create_namespaced_config_map(namespace, obj)
            else:
                cluster.core.create_namespaced_secret(namespace, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise


def start_real_connector(
    workdir: Path,
    *,
    folder: Path,
    reserved: ReservedPorts,
    cluster: TestCluster,
    namespace: str,
    director_port: int,
    director_configuration_file: Path,
    signing_key: rsa.RSAPrivateKey,
    signing_kid: str,
    issuer: str,
) -> RealConnector:
    """Starts the front, Oathkeeper, hydrator and Connector (in that order: Connector hands out
    the front's URLs; the hydrator's start reads Director through Oathkeeper) and returns once
    each is ready.

    `folder`: build-connector.sh's output. `reserved`: the ports, held until each process
    starts (Oathkeeper's is in Director's configuration already). `director_port`: Director's
    GraphQL listener. `signing_key`/`signing_kid`: the key Director verifies JWTs with (the
    gateway's JWKS), which Oathkeeper's id_token mutator signs with. Stops what it started when
    it fails."""
    reason = why_not_here()
    if reason is not None:
        raise ConnectorUnavailable(reason)
    ports = reserved.ports
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config"
    config.mkdir(exist_ok=True)
    ca = pki.new_ca("real-connector client CA", key=pki.new_rsa_key())
    stack = RealConnector(workdir=workdir, ports=ports, ca=ca)
    began = time.monotonic()
    try:
        _prepare_cluster(cluster, namespace, ca)
        stack.front = CertificateSecuredFront(ports.front, ca.cert_pem, stack.oathkeeper_url)
        reserved.release("front")
        stack.front.start()

        accounts = ServiceAccountStandIn()
        secrets_dir = workdir / "secrets"
        secrets_dir.mkdir(mode=0o700, exist_ok=True)

        def secret_file(name: str, text: str) -> Path:
            path = secrets_dir / name
            path.write_text(text)
            path.chmod(0o600)
            return path

        internal = f"{stack.oathkeeper_url}/director-internal/graphql"

        # -- Oathkeeper
        phase = time.monotonic()
        rules = config / "oathkeeper-rules.json"
        rules.write_text(json.dumps(access_rules(ports, director_port), indent=2))
        service_account_jwks = config / "serviceaccount-jwks.json"
        service_account_jwks.write_text(json.dumps(accounts.jwks()))
        signing_jwks = secret_file(
            "id-token-jwks.json", json.dumps(private_jwks(signing_key, signing_kid))
        )
        oathkeeper_file = config / "oathkeeper.yaml"
        oathkeeper_file.write_text(
            yaml.safe_dump(
                oathkeeper_config(
                    ports,
                    rules_file=rules,
                    service_account_jwks=service_account_jwks,
                    signing_jwks=signing_jwks,
                    issuer=issuer,
                    service_account_issuer=accounts.issuer,
                )
            )
        )
        reserved.release("oathkeeper", "oathkeeper_api", "oathkeeper_metrics")
        oathkeeper = _start(
            "oathkeeper",
            [
                str(folder / f"oathkeeper-{OATHKEEPER_VERSION}" / "oathkeeper"),
                "serve",
                "--config",
                str(oathkeeper_file),
            ],
            _base_env(workdir),
            workdir,
        )
        stack.processes.append(oathkeeper)
        # First: the hydrator's start waits for Director through Oathkeeper.
        _wait_ready(oathkeeper, f"http://127.0.0.1:{ports.oathkeeper_api}/health/ready")

        # -- hydrator
        home = workdir / "hydrator-home"
        (home / ".kube").mkdir(parents=True, exist_ok=True)
        (home / ".kube" / "config").write_text(cluster.kubeconfig_text)
        (home / ".kube" / "config").chmod(0o600)
        static_groups = config / "static-groups.yaml"
        static_groups.write_text("[]\n")
        hydrator_env = {
            **_base_env(home),
            "APP_ADDRESS": f"127.0.0.1:{ports.hydrator}",
            "APP_METRICS_ADDRESS": f"127.0.0.1:{ports.hydrator_metrics}",
            "APP_DIRECTOR_INTERNAL_URL": internal,
            "APP_DIRECTOR_INTERNAL_GATEWAY_URL": internal,
            "APP_CONFIGURATION_FILE": str(director_configuration_file),
            "APP_STATIC_GROUPS_SRC": str(static_groups),
            "APP_REVOCATION_CONFIG_MAP_NAME": f"{namespace}/{REVOCATIONS_CONFIG_MAP}",
            "APP_CERT_SUBJECT_MAPPING_RESYNC_INTERVAL": "60s",
            "APP_SUBJECT_CONSUMER_MAPPING_CONFIG": "[]",
            "APP_CONSUMER_CLAIMS_CLIENT_ID_KEY": "client_id",
            "APP_CONSUMER_CLAIMS_TENANT_ID_KEY": "tenantid",
            "APP_CONSUMER_CLAIMS_USER_NAME_KEY": "user_name",
            "APP_LOG_LEVEL": "info",
            **{f"APP_CSR_SUBJECT_{k}": v for k, v in CSR_SUBJECT.items()},
        }
        reserved.release("hydrator", "hydrator_metrics")
        hydrator = _start(
            "hydrator",
            [str(folder / "hydrator")],
            hydrator_env,
            workdir,
            service_account_token=secret_file("hydrator.token", accounts.token("compass-hydrator")),
        )
        stack.processes.append(hydrator)

        # -- Connector
        home = workdir / "connector-home"
        (home / ".kube").mkdir(parents=True, exist_ok=True)
        # Connector's own spelling of the kubeconfig's name (cmd/main.go).
        (home / ".kube" / "Config").write_text(cluster.kubeconfig_text)
        (home / ".kube" / "Config").chmod(0o600)
        connector_env = {
            **_base_env(home),
            "APP_EXTERNAL_ADDRESS": f"127.0.0.1:{ports.connector}",
            "APP_CA_SECRET_NAME": f"{namespace}/{CA_SECRET}",
            "APP_REVOCATION_CONFIG_MAP_NAME": f"{namespace}/{REVOCATIONS_CONFIG_MAP}",
            "APP_ONE_TIME_TOKEN_URL": internal,
            # Returned verbatim in `managementPlaneInfo`: the certificate-secured URLs.
            "APP_DIRECTOR_URL": stack.certificate_secured_director_url,
            "APP_CERTIFICATE_SECURED_CONNECTOR_URL": stack.certificate_secured_connector_url,
            "APP_CERTIFICATE_VALIDITY_TIME": CERTIFICATE_VALIDITY,
            "APP_LOG_LEVEL": "info",
            **{f"APP_CSR_SUBJECT_{k}": v for k, v in CSR_SUBJECT.items()},
        }
        reserved.release("connector")
        connector = _start(
            "connector",
            [str(folder / "connector")],
            connector_env,
            workdir,
            service_account_token=secret_file(
                "connector.token", accounts.token("compass-connector")
            ),
        )
        stack.processes.append(connector)

        _wait_ready(hydrator, f"http://127.0.0.1:{ports.hydrator}/readyz")
        _wait_ready(connector, f"http://127.0.0.1:{ports.connector}/healthz")
        stack.timings["processes"] = time.monotonic() - phase
        stack.timings["total"] = time.monotonic() - began
    except BaseException:
        with contextlib.suppress(Exception):
            stack.stop()
        raise
    finally:
        reserved.close()
    return stack
