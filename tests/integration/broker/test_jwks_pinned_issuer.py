"""`jwks` mode with a pinned issuer (`BROKER_JWKS_ISSUER_URL`), through real HTTP.

A small local server plays each runtime's issuer: `GET /<runtime ID>/openid/v1/jwks` serves the
public half of that runtime cluster's real ServiceAccount key (`pki/sa.pub`). Tokens carry the
claims of a real token of that cluster, re-issued by the pinned issuer with the cluster's real
signing key (`pki/sa.key`). The broker must accept exactly those and refuse other issuers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
SUFFIX = "/openid/v1/jwks"


class IssuerServer:
    """Serves one JWKS per runtime ID on 127.0.0.1 (free port); records the paths asked for."""

    def __init__(self) -> None:
        self.documents: dict[str, bytes] = {}
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                runtime_id = self.path.removeprefix("/").removesuffix(SUFFIX)
                body = outer.documents.get(runtime_id) if self.path.endswith(SUFFIX) else None
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/jwk-set+json")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def issuer(self, runtime_id: str) -> str:
        return f"{self.base}/{runtime_id}"

    def start(self) -> IssuerServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def issuers() -> Iterator[IssuerServer]:
    server = IssuerServer().start()
    try:
        yield server
    finally:
        server.stop()


def publish(server: IssuerServer, rt: Runtime) -> str:
    """Publishes the runtime cluster's real public key under the kid its API server uses."""
    kid = str(jwt.get_unverified_header(rt.token())["kid"])
    public = load_pem_public_key((rt.cluster.workdir / "pki" / "sa.pub").read_bytes())
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))  # type: ignore[arg-type]
    jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
    server.documents[rt.runtime_id] = json.dumps({"keys": [jwk]}).encode()
    return kid


def reissued(rt: Runtime, *, issuer: str, signer: Runtime | None = None, **claims: Any) -> str:
    """A real token's claims with `iss` (and `claims`) replaced, signed with a cluster's key."""
    signer = signer or rt
    real = signer.token()
    payload = jwt.decode(real, options={"verify_signature": False})
    payload.update({"iss": issuer, **claims})
    key = (signer.cluster.workdir / "pki" / "sa.key").read_bytes()
    kid = jwt.get_unverified_header(real)["kid"]
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})


def outcome(response: Any) -> tuple[int, str]:
    return response.status_code, str(response.json().get("type", "")).removeprefix(PROBLEM)


def test_pinned_issuer_accepts_its_tokens_and_refuses_other_issuers(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    runtime_b: TestCluster,
    issuers: IssuerServer,
) -> None:
    a = seed_runtime(control_plane, kcp_ns, runtime_a)
    b = seed_runtime(control_plane, kcp_ns, runtime_b)
    publish(issuers, a)
    publish(issuers, b)
    # Keys come from the pinned issuer, not through the kubeconfig: without it, A still works.
    control_plane.core.delete_namespaced_secret(f"kubeconfig-{a.runtime_id}".lower(), kcp_ns)
    broker = brokers(
        BROKER_IDENTITY_MODE="jwks", BROKER_JWKS_ISSUER_URL=issuers.base + "/{runtime_id}"
    )

    # A valid token of the pinned issuer for A: accepted.
    r = broker.request_token(a.runtime_id, reissued(a, issuer=issuers.issuer(a.runtime_id)))
    assert r.status_code == 201, r.text
    assert f"/{a.runtime_id}{SUFFIX}" in issuers.paths

    # The cluster's own token (issuer = its API server, same key and kid): another issuer.
    assert outcome(broker.request_token(a.runtime_id, a.token())) == (403, "identity-forbidden")
    # A's key, a foreign issuer.
    forged_iss = reissued(a, issuer="https://issuer.example.invalid/")
    assert outcome(broker.request_token(a.runtime_id, forged_iss)) == (403, "identity-forbidden")
    # B's pinned issuer and key, presented for A: B's identity, not A's.
    b_token = reissued(b, issuer=issuers.issuer(b.runtime_id))
    assert outcome(broker.request_token(a.runtime_id, b_token)) == (403, "identity-forbidden")
    # A's issuer name on a token signed with B's key: the signature does not hold.
    mixed = reissued(a, issuer=issuers.issuer(a.runtime_id), signer=b)
    assert outcome(broker.request_token(a.runtime_id, mixed)) == (403, "identity-forbidden")
    # The right issuer, but expired or for another audience: no identity.
    now = int(time.time())
    expired = reissued(
        a, issuer=issuers.issuer(a.runtime_id), iat=now - 3600, nbf=now - 3600, exp=now - 1800
    )
    assert outcome(broker.request_token(a.runtime_id, expired)) == (401, "identity-not-proven")
    other_aud = reissued(a, issuer=issuers.issuer(a.runtime_id), aud=["someone-else"])
    assert outcome(broker.request_token(a.runtime_id, other_aud)) == (401, "identity-not-proven")

    # B, with its own pinned issuer, is accepted for B.
    assert broker.request_token(b.runtime_id, b_token).status_code == 201
