"""TokenReview and JWKS verifiers against MockTransport API servers: the runtime's own cluster
is asked, with the audience; verdicts are cached by hash; unknown kids refetch keys once."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity import claims
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.kube.client import KubeClient
from control_plane_broker.kube.config import ClusterAccess
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.model import KymaView

ALLOWED = frozenset({("kyma-system", "compass-agent")})
KUBECONFIG = {
    "apiVersion": "v1",
    "clusters": [{"name": "c", "cluster": {"server": "http://runtime-a.test"}}],
    "users": [{"name": "u", "user": {"token": "admin-token"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}
KYMA = KymaView(name="rt-a", namespace="kcp-system", uid="u", resource_version="1")


class World:
    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.secret_reads = 0
        self.jwks_reads = 0
        self.valid: dict[str, str] = {}  # token -> username
        self.jwks: dict[str, Any] = {"keys": []}

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "kcp.test":
            self.secret_reads += 1
            assert request.url.params["labelSelector"] == "operator.kyma-project.io/kyma-name=rt-a"
            data = base64.b64encode(yaml.safe_dump(KUBECONFIG).encode()).decode()
            return httpx.Response(200, json={"items": [{"data": {"config": data}}]})
        assert request.url.host == "runtime-a.test"
        assert request.headers["Authorization"] == "Bearer admin-token"
        if request.url.path.endswith("tokenreviews"):
            spec = json.loads(request.content)["spec"]
            self.reviews.append(spec)
            user = self.valid.get(spec["token"])
            status: dict[str, Any] = {"authenticated": user is not None}
            if user:
                status |= {"user": {"username": user}, "audiences": spec["audiences"]}
            return httpx.Response(201, json={"status": status})
        if request.url.path == "/.well-known/openid-configuration":
            return httpx.Response(200, json={"issuer": "https://issuer.test"})
        if request.url.path == "/openid/v1/jwks":
            self.jwks_reads += 1
            assert "application/jwk-set+json" in request.headers["Accept"]
            return httpx.Response(200, json=self.jwks)
        return httpx.Response(404)


def access(world: World, clock: Any = time.time) -> tuple[RuntimeAccess, KubeClient]:
    transport = httpx.MockTransport(world.handler)
    kcp = KubeClient(ClusterAccess(server="http://kcp.test"), transport=transport)
    return (
        RuntimeAccess(
            kcp, namespace="kcp-system", ttl_seconds=60, clock=clock, transport=transport
        ),
        kcp,
    )


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_tokenreview_asks_runtime_with_audience_and_caches_by_hash() -> None:
    world = World()
    world.valid["tok-a"] = "system:serviceaccount:kyma-system:compass-agent"
    world.valid["tok-other-sa"] = "system:serviceaccount:default:default"
    runtime_access, kcp = access(world)
    verifier = TokenReviewVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        cache_max_seconds=60,
        clock=time.time,
    )
    ident = await verifier.verify(kyma=KYMA, runtime_id="RT-A", headers=bearer("tok-a"))
    assert ident.subject.endswith("compass-agent")
    assert world.reviews == [{"token": "tok-a", "audiences": ["compass-broker"]}]
    await verifier.verify(kyma=KYMA, runtime_id="RT-A", headers=bearer("tok-a"))
    assert len(world.reviews) == 1  # cached
    assert world.secret_reads == 1
    # The verdict is kept under the fingerprint of (runtime, token), never under the token.
    assert list(verifier._cache) == [claims.token_fingerprint("RT-A", "tok-a")]
    assert "tok-a" not in repr(verifier._cache)
    with pytest.raises(IdentityNotProven):
        await verifier.verify(kyma=KYMA, runtime_id="RT-A", headers=bearer("tok-of-b"))
    with pytest.raises(IdentityForbidden):
        await verifier.verify(kyma=KYMA, runtime_id="RT-A", headers=bearer("tok-other-sa"))
    await runtime_access.aclose()
    await kcp.aclose()


def _jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algo = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    jwk: dict[str, Any] = json.loads(algo.to_jwk(key.public_key()))
    return jwk | {"kid": kid, "alg": alg, "use": "sig"}


@pytest.mark.parametrize(
    ("alg", "make_key"),
    [
        ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        ("ES256", lambda: ec.generate_private_key(ec.SECP256R1())),
    ],
)
async def test_jwks_verifies_locally_and_refetches_on_unknown_kid(alg: str, make_key: Any) -> None:
    world = World()
    old, new = make_key(), make_key()
    world.jwks = {"keys": [_jwk(old, "old", alg)]}
    now = [1000.0]
    runtime_access, kcp = access(world)
    http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
    verifier = JwksVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        issuer_url="",
        http=http,
        clock=lambda: now[0],
        refetch_seconds=10,
    )
    t = int(time.time())
    claims = {
        "iss": "https://issuer.test",
        "aud": ["compass-broker"],
        "exp": t + 600,
        "nbf": t - 5,
        "sub": "system:serviceaccount:kyma-system:compass-agent",
    }

    def sign(key: Any, kid: str, **changes: Any) -> str:
        return jwt.encode(claims | changes, key, algorithm=alg, headers={"kid": kid})

    await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(sign(old, "old")))
    await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(sign(old, "old")))
    assert world.jwks_reads == 1
    for bad in (
        sign(old, "old", aud=["other"]),
        sign(old, "old", exp=t - 100),
        sign(old, "old", nbf=t + 600),
    ):
        with pytest.raises(IdentityNotProven):
            await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(bad))
    # Well-formed ServiceAccount tokens of another issuer or key: another cluster's identity.
    for foreign in (
        sign(old, "old", iss="https://other.test"),
        sign(new, "old"),  # right kid, wrong key
    ):
        with pytest.raises(IdentityForbidden, match="not issued by this runtime's cluster"):
            await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(foreign))
    with pytest.raises(IdentityForbidden):
        await verifier.verify(
            kyma=KYMA,
            runtime_id="rt-a",
            headers=bearer(sign(old, "old", sub="system:serviceaccount:default:x")),
        )
    # Key rotation: an unknown kid refetches, but not more than once per refetch period.
    world.jwks = {"keys": [_jwk(old, "old", alg), _jwk(new, "new", alg)]}
    now[0] += 11
    await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(sign(new, "new")))
    assert world.jwks_reads == 2
    for _ in range(3):
        with pytest.raises(IdentityForbidden):
            await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(sign(new, "nope")))
    assert world.jwks_reads == 2
    await http.aclose()
    await runtime_access.aclose()
    await kcp.aclose()


async def test_jwks_keys_expire_so_a_retired_key_stops_being_trusted() -> None:
    world = World()
    retired, current = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2)
    )
    world.jwks = {"keys": [_jwk(retired, "retired", "RS256")]}
    now = [1000.0]
    runtime_access, kcp = access(world)
    http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
    verifier = JwksVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        issuer_url="",
        http=http,
        clock=lambda: now[0],
        refetch_seconds=10,
        max_age_seconds=300,
    )
    t = int(time.time())
    token = jwt.encode(
        {
            "iss": "https://issuer.test",
            "aud": ["compass-broker"],
            "exp": t + 3600,
            "sub": "system:serviceaccount:kyma-system:compass-agent",
        },
        retired,
        algorithm="RS256",
        headers={"kid": "retired"},
    )
    await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(token))
    # The cluster retires the key. Within the key lifetime the cached set still answers ...
    world.jwks = {"keys": [_jwk(current, "current", "RS256")]}
    now[0] += 299
    await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 1
    # ... after it, the keys are fetched again and the retired key is no longer trusted.
    now[0] += 2
    with pytest.raises(IdentityForbidden):
        await verifier.verify(kyma=KYMA, runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 2
    await http.aclose()
    await runtime_access.aclose()
    await kcp.aclose()
