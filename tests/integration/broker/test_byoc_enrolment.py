"""BYOC enrolment (double opt-in) on real API servers, the Compass simulator and a real broker.

The runtimes have a Kyma in KCP but no kubeconfig Secret there. One test enrols a runtime
cluster's own API server as the issuer, with its real tokens (the cluster publishes discovery to
anonymous callers, as a self-managed BYOC cluster would). Elsewhere the issuers are
played by a local HTTPS server (under a throw-away CA the broker trusts through
`BROKER_ISSUER_CA_FILE`) that serves an OIDC discovery document and a key set per issuer: the
public half of the runtime cluster's real ServiceAccount key, or a key the test rotates to.
Tokens carry the claims of a real token of that cluster, re-issued under the issuer's URL.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from control_plane_broker.registration.state import (
    ANNOTATION_EXPIRES,
    ANNOTATION_HOLDER,
    ANNOTATION_ISSUER_APPROVED,
    ANNOTATION_ISSUER_PENDING,
    ANNOTATION_ISSUER_PENDING_SINCE,
)
from devenv import pki
from devenv.clusters import TestCluster
from tests.integration.broker.conftest import (
    GROUP,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)
from tests.integration.broker.test_jwks_pinned_issuer import outcome, reissued

DISCOVERY = "/.well-known/openid-configuration"


class HttpsIssuers:
    """OIDC issuers at `https://127.0.0.1:<port>/<name>`; records every path asked for."""

    def __init__(self, workdir: Path) -> None:
        ca = pki.new_ca("test issuers")
        leaf = pki.issue(ca, common_name="issuers", server_hosts=("127.0.0.1",))
        self.ca_file = workdir / "issuers-ca.pem"
        self.ca_file.write_bytes(ca.cert_pem)
        leaf.write(workdir / "issuer.pem", workdir / "issuer-key.pem")
        self.keys: dict[str, list[dict[str, Any]]] = {}
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                name, _, rest = self.path.removeprefix("/").partition("/")
                body: dict[str, Any] | None = None
                if name in outer.keys and "/" + rest == DISCOVERY:
                    issuer = outer.issuer(name)
                    body = {"issuer": issuer, "jwks_uri": issuer + "/keys"}
                elif name in outer.keys and rest == "keys":
                    body = {"keys": outer.keys[name]}
                raw = json.dumps(body).encode() if body is not None else b""
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(workdir / "issuer.pem", workdir / "issuer-key.pem")
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def issuer(self, name: str) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/{name}"

    def asked(self, name: str) -> list[str]:
        return [p for p in self.paths if p.startswith(f"/{name}/")]

    def serve_cluster_key(self, name: str, rt: Runtime) -> None:
        """The runtime cluster's real public key, under the kid its API server uses."""
        kid = str(jwt.get_unverified_header(rt.token())["kid"])
        public = load_pem_public_key((rt.cluster.workdir / "pki" / "sa.pub").read_bytes())
        self.serve_key(name, public, kid)

    def serve_key(self, name: str, public: Any, kid: str) -> None:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
        self.keys[name] = [jwk | {"kid": kid, "alg": "RS256", "use": "sig"}]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def issuers(tmp_path: Path) -> Iterator[HttpsIssuers]:
    server = HttpsIssuers(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def byoc_runtime(kcp: TestCluster, namespace: str, cluster: TestCluster) -> Runtime:
    """A Kyma in KCP with no kubeconfig Secret: the control plane cannot reach this cluster."""
    rt = seed_runtime(kcp, namespace, cluster)
    kcp.core.delete_namespaced_secret(f"kubeconfig-{rt.runtime_id}".lower(), namespace)
    return rt


def annotations(rt: Runtime) -> dict[str, str]:
    mapping = rt.mapping() or {}
    return dict((mapping.get("metadata") or {}).get("annotations") or {})


def approve(rt: Runtime, issuer: str) -> None:
    """What the documented one command does: approve, and clear the pending record."""
    rt.kcp.custom.patch_namespaced_custom_object(
        GROUP,
        "v1beta1",
        rt.namespace,
        "compassmanagermappings",
        rt.kyma_name,
        {
            "metadata": {
                "annotations": {
                    ANNOTATION_ISSUER_APPROVED: issuer,
                    ANNOTATION_ISSUER_PENDING: None,
                    ANNOTATION_ISSUER_PENDING_SINCE: None,
                }
            }
        },
    )


def enrolment_events(rt: Runtime) -> list[Any]:
    return [
        e
        for e in rt.kcp.core.list_namespaced_event(
            rt.namespace, field_selector="reason=EnrolmentPending"
        ).items
        if e.involved_object.name == rt.kyma_name
    ]


def signed_with(rt: Runtime, key: rsa.RSAPrivateKey, *, kid: str, issuer: str) -> str:
    """A real token's claims under `issuer`, signed with a key the cluster rotated to."""
    payload = jwt.decode(rt.token(), options={"verify_signature": False}) | {"iss": issuer}
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})


def until_issued(broker: Any, runtime_id: str, token: str, *, timeout: float = 30.0) -> Any:
    """The answer once the broker issues (its views catch up, or keys may be fetched again)."""
    return wait_for(
        lambda: (r := broker.request_token(runtime_id, token)).status_code == 201 and r,
        timeout=timeout,
        interval=0.5,
        what="a token to be issued",
    )


@pytest.mark.parametrize("mode", ["tokenreview", "jwks"])
def test_an_issuer_is_pending_until_approved_then_tokens_flow_through_key_rotation(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    issuers: HttpsIssuers,
    mode: str,
) -> None:
    a = byoc_runtime(control_plane, kcp_ns, runtime_a)
    issuers.serve_cluster_key("a", a)
    iss = issuers.issuer("a")
    broker = brokers(BROKER_IDENTITY_MODE=mode, BROKER_ISSUER_CA_FILE=str(issuers.ca_file))

    # First contact: refused with a clear problem, the issuer recorded as pending.
    r = broker.request_token(a.runtime_id, reissued(a, issuer=iss))
    assert outcome(r) == (403, "enrolment-pending"), r.text
    assert iss in r.json()["detail"]
    pending = annotations(a)
    assert pending[ANNOTATION_ISSUER_PENDING] == iss
    assert ANNOTATION_ISSUER_PENDING_SINCE in pending
    # Recorded, not claimed, not approved: the broker never approves.
    assert not {ANNOTATION_ISSUER_APPROVED, ANNOTATION_HOLDER, ANNOTATION_EXPIRES} & set(pending)
    # The operator is told, on the Kyma, which issuer waits and the one command to approve it.
    events = wait_for(lambda: enrolment_events(a), what="the EnrolmentPending Event")
    assert events[0].type == "Warning"
    assert (
        f"kubectl -n {kcp_ns} annotate compassmanagermapping {a.kyma_name} --overwrite "
        f"{ANNOTATION_ISSUER_APPROVED}={iss} "
    ) in events[0].message
    # Nothing was fetched from a URL that only the caller named.
    assert issuers.paths == []

    approve(a, iss)
    issued = until_issued(broker, a.runtime_id, reissued(a, issuer=iss))
    assert issued.json()["token"]
    assert issuers.asked("a") == ["/a" + DISCOVERY, "/a/keys"]
    after = annotations(a)
    assert after[ANNOTATION_ISSUER_APPROVED] == iss
    assert ANNOTATION_ISSUER_PENDING not in after
    assert (a.mapping() or {})["metadata"]["labels"].get("kyma-project.io/compass-runtime-id")

    # The cluster rotates its ServiceAccount key: the issuer serves only the new one.
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuers.serve_key("a", rotated.public_key(), "rotated")
    new_token = signed_with(a, rotated, kid="rotated", issuer=iss)
    until_issued(broker, a.runtime_id, new_token)
    assert issuers.asked("a")[-1] == "/a/keys"
    # A fresh token under the retired key is no longer accepted.
    assert outcome(broker.request_token(a.runtime_id, reissued(a, issuer=iss))) == (
        403,
        "identity-forbidden",
    )


def test_another_cluster_with_the_same_runtime_id_is_refused_and_cannot_take_the_enrolment(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    runtime_b: TestCluster,
    issuers: HttpsIssuers,
) -> None:
    a = byoc_runtime(control_plane, kcp_ns, runtime_a)
    # B: another cluster with its own issuer, which knows A's runtime ID.
    b = Runtime(a.runtime_id, a.tenant, runtime_b, control_plane, kcp_ns)
    runtime_b.ensure_service_account("kyma-system", "compass-agent")
    issuers.serve_cluster_key("a", a)
    issuers.serve_cluster_key("b", b)
    iss_a, iss_b = issuers.issuer("a"), issuers.issuer("b")
    broker = brokers(BROKER_ISSUER_CA_FILE=str(issuers.ca_file))

    assert outcome(broker.request_token(a.runtime_id, reissued(a, issuer=iss_a))) == (
        403,
        "enrolment-pending",
    )
    # B asks for A's runtime: refused, and the issuer pending for A stays A's.
    assert outcome(broker.request_token(a.runtime_id, reissued(b, issuer=iss_b))) == (
        403,
        "enrolment-pending",
    )
    assert annotations(a)[ANNOTATION_ISSUER_PENDING] == iss_a

    approve(a, iss_a)
    until_issued(broker, a.runtime_id, reissued(a, issuer=iss_a))
    # With A's issuer approved: B's own issuer is still not approved; B's key under A's issuer
    # name does not verify; B's real token (its API server's issuer) is another issuer again.
    for token, expected in (
        (reissued(b, issuer=iss_b), "enrolment-pending"),
        (reissued(b, issuer=iss_a), "identity-forbidden"),
        (b.token(), "enrolment-pending"),
    ):
        assert outcome(broker.request_token(a.runtime_id, token)) == (403, expected)
    assert annotations(a)[ANNOTATION_ISSUER_APPROVED] == iss_a
    # B's issuer was never contacted: only approved issuers are.
    assert issuers.asked("b") == []


def test_a_changed_issuer_needs_a_new_approval(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    issuers: HttpsIssuers,
) -> None:
    a = byoc_runtime(control_plane, kcp_ns, runtime_a)
    issuers.serve_cluster_key("old", a)
    issuers.serve_cluster_key("new", a)
    old, new = issuers.issuer("old"), issuers.issuer("new")
    broker = brokers(BROKER_ISSUER_CA_FILE=str(issuers.ca_file))
    assert broker.request_token(a.runtime_id, reissued(a, issuer=old)).status_code == 403
    approve(a, old)
    until_issued(broker, a.runtime_id, reissued(a, issuer=old))

    # The cluster now presents another issuer (same keys even): pending again, approval kept.
    r = broker.request_token(a.runtime_id, reissued(a, issuer=new))
    assert outcome(r) == (403, "enrolment-pending")
    recorded = annotations(a)
    assert (recorded[ANNOTATION_ISSUER_APPROVED], recorded[ANNOTATION_ISSUER_PENDING]) == (old, new)
    wait_for(
        lambda: any(f"the approved issuer is {old}" in e.message for e in enrolment_events(a)),
        what="an Event naming the approved and the new issuer",
    )
    assert issuers.asked("new") == []

    approve(a, new)
    until_issued(broker, a.runtime_id, reissued(a, issuer=new))
    # The old issuer is no longer approved.
    assert outcome(broker.request_token(a.runtime_id, reissued(a, issuer=old))) == (
        403,
        "enrolment-pending",
    )


def test_without_a_kyma_or_a_plausible_token_or_with_enrolment_off_nothing_is_recorded(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    issuers: HttpsIssuers,
) -> None:
    a = byoc_runtime(control_plane, kcp_ns, runtime_a)
    issuers.serve_cluster_key("a", a)
    iss = issuers.issuer("a")
    broker = brokers(BROKER_ISSUER_CA_FILE=str(issuers.ca_file))
    # An unknown runtime: 401 as ever, nobody learns whether it exists.
    unknown = Runtime("0F0E0D0C-0000-4000-8000-000000000000", "t", runtime_a, control_plane, kcp_ns)
    assert outcome(broker.request_token(unknown.runtime_id, reissued(a, issuer=iss))) == (
        401,
        "identity-not-proven",
    )
    assert unknown.mapping() is None
    # A token that is not even an agent's (wrong audience, plain http issuer): no identity.
    for token in (
        reissued(a, issuer=iss, aud=["someone-else"]),
        reissued(a, issuer=iss.replace("https://", "http://")),
        "garbage",
    ):
        assert outcome(broker.request_token(a.runtime_id, token)) == (401, "identity-not-proven")
    assert a.mapping() is None
    broker.stop()

    off = brokers(BROKER_BYOC_ENROLMENT="false", BROKER_ISSUER_CA_FILE=str(issuers.ca_file))
    r = off.request_token(a.runtime_id, reissued(a, issuer=iss))
    assert outcome(r) == (401, "identity-not-proven")
    assert a.mapping() is None
    assert issuers.paths == []


def test_a_real_api_server_enrolled_as_the_issuer_with_real_tokens(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_b: TestCluster,
) -> None:
    runtime_b.publish_issuer_discovery()
    b = byoc_runtime(control_plane, kcp_ns, runtime_b)
    broker = brokers(BROKER_ISSUER_CA_FILE=str(runtime_b.ca_file))
    r = broker.request_token(b.runtime_id, b.token())
    assert outcome(r) == (403, "enrolment-pending")
    assert annotations(b)[ANNOTATION_ISSUER_PENDING] == runtime_b.issuer
    approve(b, runtime_b.issuer)
    until_issued(broker, b.runtime_id, b.token())
    # Another ServiceAccount of the same cluster: a valid identity, not an allowed one.
    assert outcome(broker.request_token(b.runtime_id, b.token(sa="default", ns="default"))) == (
        403,
        "identity-forbidden",
    )
