"""TokenReview and JWKS verifiers against MockTransport API servers: the runtime's own cluster
is asked (found through its kubeconfig Secret in KCP, by exact name), with the audience; verdicts
are cached by hash; keys are cached per runtime, fetched once for concurrent callers, and an
unknown kid or a failed fetch does not make the broker hammer the cluster. Runtime access:
hostile kubeconfigs are refused before any request leaves, clients are shared per cluster."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    IdentityForbidden,
    IdentityNotProven,
    RuntimeKubeconfigInvalid,
)
from control_plane_broker.identity import claims
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.kube.runtime_access import NEGATIVE_SECONDS, RuntimeAccess
from kubeapi import ClusterAccess, KubeClient

ALLOWED = frozenset({("kyma-system", "compass-agent")})
SECRETS = "/api/v1/namespaces/kcp-system/secrets/"


def kubeconfig(server: str = "https://runtime-a.test", **user: object) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user or {"token": "admin-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def secret(config: dict[str, Any] | str) -> dict[str, Any]:
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    return {"data": {"config": base64.b64encode(text.encode()).decode()}}


class World:
    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.secret_reads: list[str] = []
        self.jwks_reads = 0
        self.runtime_requests = 0
        self.valid: dict[str, str] = {}  # token -> username
        self.jwks: dict[str, Any] = {"keys": []}
        self.jwks_status = 200
        self.secrets: dict[str, dict[str, Any]] = {"kubeconfig-rt-a": secret(kubeconfig())}

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "kcp.test":
            assert request.method == "GET"
            assert request.url.path.startswith(SECRETS)  # read by name, never listed
            name = request.url.path.removeprefix(SECRETS)
            self.secret_reads.append(name)
            found = self.secrets.get(name)
            if found is None:
                return httpx.Response(404, json={"kind": "Status", "code": 404})
            return httpx.Response(200, json=found)
        assert request.url.host == "runtime-a.test"
        assert request.headers["Authorization"] == "Bearer admin-token"
        self.runtime_requests += 1
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
            if self.jwks_status != 200:
                return httpx.Response(self.jwks_status, json={"message": "unavailable"})
            return httpx.Response(200, json=self.jwks)
        return httpx.Response(404)


def access(
    world: World, clock: Any = time.time, on_invalid: Any = None
) -> tuple[RuntimeAccess, KubeClient]:
    transport = httpx.MockTransport(world.handler)
    kcp = KubeClient(ClusterAccess(server="https://kcp.test"), user_agent="t", transport=transport)
    return (
        RuntimeAccess(
            kcp,
            namespace="kcp-system",
            secret_name_pattern="kubeconfig-{runtime_id}",
            ttl_seconds=60,
            clock=clock,
            transport=transport,
            on_invalid=on_invalid,
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
    ident = await verifier.verify(runtime_id="RT-A", headers=bearer("tok-a"))
    assert ident.subject.endswith("compass-agent")
    assert world.reviews == [{"token": "tok-a", "audiences": ["compass-broker"]}]
    await verifier.verify(runtime_id="RT-A", headers=bearer("tok-a"))
    assert len(world.reviews) == 1  # cached
    assert world.secret_reads == ["kubeconfig-rt-a"]  # exact name, lower-cased ID
    # The verdict is kept under the fingerprint of (runtime, token), never under the token.
    assert list(verifier._cache) == [claims.token_fingerprint("RT-A", "tok-a")]
    assert "tok-a" not in repr(verifier._cache)
    with pytest.raises(IdentityNotProven):
        await verifier.verify(runtime_id="RT-A", headers=bearer("tok-of-b"))
    with pytest.raises(IdentityForbidden):
        await verifier.verify(runtime_id="RT-A", headers=bearer("tok-other-sa"))
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

    await verifier.verify(runtime_id="rt-a", headers=bearer(sign(old, "old")))
    await verifier.verify(runtime_id="rt-a", headers=bearer(sign(old, "old")))
    assert world.jwks_reads == 1
    for bad in (
        sign(old, "old", aud=["other"]),
        sign(old, "old", exp=t - 100),
        sign(old, "old", nbf=t + 600),
    ):
        with pytest.raises(IdentityNotProven):
            await verifier.verify(runtime_id="rt-a", headers=bearer(bad))
    # Well-formed ServiceAccount tokens of another issuer or key: another cluster's identity.
    for foreign in (
        sign(old, "old", iss="https://other.test"),
        sign(new, "old"),  # right kid, wrong key
    ):
        with pytest.raises(IdentityForbidden, match="not issued by this runtime's cluster"):
            await verifier.verify(runtime_id="rt-a", headers=bearer(foreign))
    with pytest.raises(IdentityForbidden):
        await verifier.verify(
            runtime_id="rt-a",
            headers=bearer(sign(old, "old", sub="system:serviceaccount:default:x")),
        )
    # Key rotation: an unknown kid refetches, but not more than once per refetch period.
    world.jwks = {"keys": [_jwk(old, "old", alg), _jwk(new, "new", alg)]}
    now[0] += 11
    await verifier.verify(runtime_id="rt-a", headers=bearer(sign(new, "new")))
    assert world.jwks_reads == 2
    for _ in range(3):
        with pytest.raises(IdentityForbidden):
            await verifier.verify(runtime_id="rt-a", headers=bearer(sign(new, "nope")))
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
    await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    # The cluster retires the key. Within the key lifetime the cached set still answers ...
    world.jwks = {"keys": [_jwk(current, "current", "RS256")]}
    now[0] += 299
    await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 1
    # ... after it, the keys are fetched again and the retired key is no longer trusted.
    now[0] += 2
    with pytest.raises(IdentityForbidden):
        await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 2
    await http.aclose()
    await runtime_access.aclose()
    await kcp.aclose()


UNUSED_HTTP = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(599)))


def _agent_token(key: Any, kid: str = "k1", **changes: Any) -> str:
    t = int(time.time())
    claims = {
        "iss": "https://issuer.test",
        "aud": ["compass-broker"],
        "exp": t + 600,
        "sub": "system:serviceaccount:kyma-system:compass-agent",
    } | changes
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": kid})


def _jwks_verifier(world: World, clock: Any) -> tuple[JwksVerifier, RuntimeAccess, KubeClient]:
    """Keys through the runtime's kubeconfig (no issuer URL: the HTTP client stays unused)."""
    runtime_access, kcp = access(world)
    verifier = JwksVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        issuer_url="",
        http=UNUSED_HTTP,
        clock=clock,
        refetch_seconds=10,
    )
    return verifier, runtime_access, kcp


async def test_jwks_keys_are_cached_per_runtime_and_fetched_once_for_concurrent_callers() -> None:
    world = World()
    key = ec.generate_private_key(ec.SECP256R1())
    world.jwks = {"keys": [_jwk(key, "k1", "ES256")]}
    verifier, runtime_access, kcp = _jwks_verifier(world, clock=lambda: 1000.0)
    token = _agent_token(key)
    # A cold start: many agents of one runtime at once, under both spellings of its ID.
    results = await asyncio.gather(
        *(verifier.verify(runtime_id=rid, headers=bearer(token)) for rid in ["rt-a", "RT-A"] * 10)
    )
    assert {r.subject for r in results} == {"system:serviceaccount:kyma-system:compass-agent"}
    assert world.jwks_reads == 1
    assert world.secret_reads == ["kubeconfig-rt-a"]
    await runtime_access.aclose()
    await kcp.aclose()


async def test_a_failed_key_fetch_is_not_repeated_for_the_refetch_period() -> None:
    world = World()
    key = ec.generate_private_key(ec.SECP256R1())
    world.jwks = {"keys": [_jwk(key, "k1", "ES256")]}
    world.jwks_status = 503
    now = [1000.0]
    verifier, runtime_access, kcp = _jwks_verifier(world, clock=lambda: now[0])
    token = _agent_token(key)
    for _ in range(5):  # an unreachable issuer is asked once, not per request
        with pytest.raises(ControlPlaneUnavailable):
            await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 1
    now[0] += 9.9
    with pytest.raises(ControlPlaneUnavailable):
        await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 1
    world.jwks_status = 200
    now[0] += 0.2  # the period is over: asked again, and it answers
    await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert world.jwks_reads == 2
    await runtime_access.aclose()
    await kcp.aclose()


# --- runtime access --------------------------------------------------------------------------


async def test_runtime_without_a_kubeconfig_secret_has_no_identity() -> None:
    world = World()
    now = [0.0]
    runtime_access, kcp = access(world, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(IdentityNotProven) as info:
            await runtime_access.client_for("rt-b")
        assert info.value.reason == "no-kubeconfig"
    assert world.secret_reads == ["kubeconfig-rt-b"]  # remembered a while, not read per request
    now[0] += NEGATIVE_SECONDS + 1
    world.secrets["kubeconfig-rt-b"] = secret(kubeconfig())
    await runtime_access.client_for("rt-b")  # an operator added it: found on the next read
    assert world.secret_reads == ["kubeconfig-rt-b", "kubeconfig-rt-b"]
    await runtime_access.aclose()
    await kcp.aclose()


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (kubeconfig(server="http://runtime-a.test"), "not-https"),
        (kubeconfig(exec={"command": "/bin/sh", "apiVersion": "x"}), "exec-plugin"),
        (kubeconfig(tokenFile="/var/run/secrets/kubernetes.io/serviceaccount/token"), "token-file"),
        (kubeconfig(username="admin", password="admin-token"), "basic-auth"),
        ("admin-token: [unclosed", "not-yaml"),
    ],
)
async def test_a_hostile_kubeconfig_is_refused_before_any_request_leaves(
    config: dict[str, Any] | str, reason: str
) -> None:
    world = World()
    world.secrets["kubeconfig-rt-a"] = secret(config)
    told: list[tuple[str, str]] = []

    async def on_invalid(runtime_id: str, problem: str) -> None:
        told.append((runtime_id, problem))

    runtime_access, kcp = access(world, on_invalid=on_invalid)
    verifier = TokenReviewVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        cache_max_seconds=60,
        clock=time.time,
    )
    for _ in range(2):
        with pytest.raises(RuntimeKubeconfigInvalid) as info:
            await verifier.verify(runtime_id="RT-A", headers=bearer("tok-a"))
        assert (info.value.status, info.value.slug) == (503, "runtime-kubeconfig-invalid")
        assert reason in str(info.value)
        assert "admin-token" not in str(info.value)
    assert world.runtime_requests == 0  # not even a TokenReview went to the named server
    assert len(told) == 1  # told once per read, not per request
    assert told[0][0] == "RT-A"
    assert told[0][1].startswith(reason)
    assert "admin-token" not in told[0][1]
    await runtime_access.aclose()
    await kcp.aclose()


async def test_a_secret_that_is_not_base64_is_refused() -> None:
    world = World()
    world.secrets["kubeconfig-rt-a"] = {"data": {"config": "not base64!"}}
    runtime_access, kcp = access(world)
    with pytest.raises(RuntimeKubeconfigInvalid, match="bad-base64"):
        await runtime_access.client_for("rt-a")
    await runtime_access.aclose()
    await kcp.aclose()


async def test_runtimes_of_one_cluster_share_one_client() -> None:
    world = World()
    world.secrets["kubeconfig-rt-b"] = secret(kubeconfig())  # the same cluster and user
    world.secrets["kubeconfig-rt-c"] = secret(kubeconfig(token="other-token"))
    runtime_access, kcp = access(world)
    a = await runtime_access.client_for("rt-a")
    assert await runtime_access.client_for("RT-A") is a  # cached under the lower-cased ID
    assert await runtime_access.client_for("rt-b") is a
    assert await runtime_access.client_for("rt-c") is not a  # other credentials
    assert world.secret_reads == ["kubeconfig-rt-a", "kubeconfig-rt-b", "kubeconfig-rt-c"]
    await runtime_access.aclose()
    await kcp.aclose()


async def test_concurrent_callers_of_one_runtime_share_one_secret_read() -> None:
    world = World()
    runtime_access, kcp = access(world)
    clients = await asyncio.gather(*(runtime_access.client_for("rt-a") for _ in range(20)))
    assert len({id(c) for c in clients}) == 1
    assert world.secret_reads == ["kubeconfig-rt-a"]
    await runtime_access.aclose()
    await kcp.aclose()


async def test_a_verified_token_is_not_verified_again_within_the_key_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    key = ec.generate_private_key(ec.SECP256R1())
    world.jwks = {"keys": [_jwk(key, "k1", "ES256")]}
    now = [1000.0]
    verifier, runtime_access, kcp = _jwks_verifier(world, clock=lambda: now[0])
    token = _agent_token(key)
    decodes = []
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        decodes.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    for _ in range(5):
        await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert len(decodes) == 1  # the signature is checked once
    # The verdict is bound to the runtime: the same token presented for another runtime is not
    # served from it (here that runtime has no kubeconfig at all, so nothing proves it).
    with pytest.raises(IdentityNotProven):
        await verifier.verify(runtime_id="rt-b", headers=bearer(token))
    assert len(decodes) == 1
    # Once the key set that verified it is older than the key age, it is checked again.
    now[0] += 301
    await verifier.verify(runtime_id="rt-a", headers=bearer(token))
    assert len(decodes) == 2
    # A token that does not verify is never cached: every attempt pays for its check.
    with pytest.raises((IdentityNotProven, IdentityForbidden)):
        await verifier.verify(runtime_id="rt-a", headers=bearer(token[:-4] + "AAAA"))
    per_attempt = len(decodes) - 2
    assert per_attempt > 0
    with pytest.raises((IdentityNotProven, IdentityForbidden)):
        await verifier.verify(runtime_id="rt-a", headers=bearer(token[:-4] + "AAAA"))
    assert len(decodes) == 2 + 2 * per_attempt
    await runtime_access.aclose()
    await kcp.aclose()
