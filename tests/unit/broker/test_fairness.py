"""Issue 28, items 1-4 without network: cheap refusals come before any request, a failure
budget and a share per runtime ID, a stalled API server remembered per cluster, the mw's
share per runtime ID and its limit, and state that stays bounded whatever IDs callers send."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.types import Message, Receive, Scope, Send

from control_plane_broker.api.first_contact_middleware import (
    FirstContactLimitMiddleware,
    identity_checked,
    release_first_contact_place,
)
from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    FirstContactsBusy,
    IdentityForbidden,
    IdentityNotProven,
    RateLimited,
    RuntimeApiSilent,
)
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.screening import ScreeningVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.kyma import KymaView
from control_plane_broker.overload.identity_budget import IdentityBudget
from control_plane_broker.overload.rate_limit import BucketPolicy, RateLimiter
from tests.unit.broker.conditions import until
from tests.unit.broker.test_identity_adapters import ALLOWED, World, access, bearer

AGENT = "system:serviceaccount:kyma-system:compass-agent"
KEY = ec.generate_private_key(ec.SECP256R1())


def sa_token(**changes: Any) -> str:
    """A well-formed ServiceAccount token for us, signed by a key no cluster knows (a forgery)."""
    header = changes.pop("header", {"kid": "k"})
    alg = changes.pop("alg", "ES256")
    payload = {
        "iss": "https://issuer.test",
        "aud": ["compass-broker"],
        # A day: parametrized tokens are made when the tests are collected, and a full run
        # reaches these a quarter of an hour later.
        "exp": int(time.time()) + 86400,
        "sub": AGENT,
        "jti": uuid.uuid4().hex,
    } | changes
    key: Any = "k" * 32 if alg.startswith("HS") else KEY
    return jwt.encode(payload, key, algorithm=alg, headers=header)


class Kymas:
    def __init__(self, *names: str, everyone: bool = False) -> None:
        self.names = set(names)
        self.everyone = everyone

    def get(self, name: str) -> KymaView | None:
        if self.everyone or name in self.names:
            return KymaView(name=name, namespace="kcp-system", uid="u", resource_version="1")
        return None


class Screened(ScreeningVerifier):
    """The identity stages of a bearer mode as the broker wires them: the cheap refusals, then
    the identity budget, then the budget's inner verifier."""

    def __init__(self, kymas: Kymas, budget: IdentityBudget) -> None:
        super().__init__(budget, kymas=kymas, audience="compass-broker")
        self.budget = budget

    def tracked(self) -> int:
        return self.budget.tracked()


def screened(
    inner: Any, kymas: Kymas, *, burst: int = 3, per_runtime: int = 2, clock: Any = time.monotonic
) -> Screened:
    budget = IdentityBudget(
        inner,
        budget=BucketPolicy(burst=burst, per_second=1 / 6),
        per_runtime=per_runtime,
        clock=clock,
    )
    return Screened(kymas, budget)


def tokenreview(world: World, **kw: Any) -> tuple[TokenReviewVerifier, RuntimeAccess, Any]:
    runtime_access, kcp = access(world, **kw)
    verifier = TokenReviewVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        cache_max_seconds=60,
        clock=time.time,
    )
    return verifier, runtime_access, kcp


# --- item 4: a bearer that cannot be a ServiceAccount token costs no request -------------------


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("x", "malformed"),
        ("not.a.jwt", "malformed"),
        (sa_token(alg="HS256"), "algorithm"),
        (
            jwt.encode(
                {"sub": AGENT, "aud": "compass-broker", "exp": 2**40}, None, algorithm="none"
            ),
            "algorithm",
        ),
        (sa_token(aud=["kubernetes"]), "audience"),
        (sa_token(aud="someone"), "audience"),
        (sa_token(exp=int(time.time()) - 60), "expired"),
        (sa_token(exp=None), "expired"),
        (sa_token(exp=True), "expired"),
        (sa_token(sub="alice"), "not-sa"),
    ],
)
async def test_a_bearer_that_cannot_be_an_sa_token_is_refused_before_any_request(
    token: str, reason: str
) -> None:
    world = World()
    inner, runtime_access, kcp = tokenreview(world)
    verifier = screened(inner, Kymas("rt-a"))
    for runtime_id in ("RT-A", "rt-unknown"):  # the same answer for every runtime ID
        with pytest.raises(IdentityNotProven) as caught:
            await verifier.verify(runtime_id=runtime_id, headers=bearer(token))
        assert caught.value.reason == reason
    assert (world.reviews, world.secret_reads, world.runtime_requests) == ([], [], 0)
    await runtime_access.aclose()
    await kcp.aclose()


# --- item 2: an unknown runtime ID is answered from the Kyma cache -----------------------------


async def test_an_unknown_runtime_id_costs_no_read_and_looks_like_a_failed_proof() -> None:
    world = World()
    inner, runtime_access, kcp = tokenreview(world)
    verifier = screened(inner, Kymas("rt-a", "rt-byoc"))
    answers = []
    for i in range(500):
        with pytest.raises(IdentityNotProven) as caught:
            await verifier.verify(runtime_id=f"rt-random-{i}", headers=bearer(sa_token()))
        answers.append(str(caught.value))
    assert world.secret_reads == []  # 500 random IDs cost 500 Secret GETs before
    # No oracle: word for word what a known runtime without a kubeconfig Secret is told.
    with pytest.raises(IdentityNotProven) as known:
        await verifier.verify(runtime_id="rt-byoc", headers=bearer(sa_token()))
    assert set(answers) == {str(known.value)}
    assert verifier.tracked() <= 1  # nothing kept for the random IDs
    await runtime_access.aclose()
    await kcp.aclose()


# --- the budget of failed proofs and the share of checks in flight -----------------------------


async def test_failed_proofs_have_a_budget_that_never_stops_a_proven_token() -> None:
    world = World()
    good = sa_token()
    world.valid[good] = AGENT
    now = [100.0]
    inner, runtime_access, kcp = tokenreview(world)
    verifier = screened(inner, Kymas("rt-a"), burst=3, clock=lambda: now[0])
    await verifier.verify(runtime_id="RT-A", headers=bearer(good))  # the agent, proven
    for _ in range(3):
        with pytest.raises(IdentityForbidden):  # forgeries: other-cluster
            await verifier.verify(runtime_id="RT-A", headers=bearer(sa_token()))
    reviews = len(world.reviews)
    with pytest.raises(RateLimited) as caught:
        await verifier.verify(runtime_id="RT-A", headers=bearer(sa_token()))
    assert 0 < (caught.value.retry_after or 0) <= 6
    assert len(world.reviews) == reviews  # refused with no request made
    # The runtime's own agent, with the token it proved itself with, is not stopped.
    await verifier.verify(runtime_id="RT-A", headers=bearer(good))
    now[0] += 6.1  # one failure refilled
    with pytest.raises(IdentityForbidden):
        await verifier.verify(runtime_id="RT-A", headers=bearer(sa_token()))
    await runtime_access.aclose()
    await kcp.aclose()


class Stalled:
    """An inner verifier whose checks wait until released."""

    mode = "tokenreview"

    def __init__(self) -> None:
        self.started = 0
        self.go = asyncio.Event()

    async def verify(self, *, runtime_id: str, headers: Any) -> Identity:
        self.started += 1
        await self.go.wait()
        raise ControlPlaneUnavailable("timeout", retry_after=5)


async def test_one_runtime_holds_at_most_its_share_of_the_checks_in_flight() -> None:
    inner = Stalled()
    verifier = screened(inner, Kymas("rt-stalled", "rt-b"), per_runtime=2)
    attackers = [
        asyncio.create_task(verifier.verify(runtime_id="rt-stalled", headers=bearer(sa_token())))
        for _ in range(48)
    ]
    await until(lambda: sum(t.done() for t in attackers) == 46)
    assert inner.started == 2
    assert all(isinstance(t.exception(), FirstContactsBusy) for t in attackers if t.done())
    other = asyncio.create_task(verifier.verify(runtime_id="rt-b", headers=bearer(sa_token())))
    await until(lambda: inner.started == 3)  # another runtime is not held up
    inner.go.set()
    await asyncio.gather(*attackers, other, return_exceptions=True)
    assert verifier.tracked() == 0


# --- item 1: a runtime API server that did not answer is remembered per cluster ----------------


async def test_an_api_server_that_timed_out_is_not_asked_again_for_a_while() -> None:
    world = World()
    world.secrets["kubeconfig-rt-b"] = world.secrets["kubeconfig-rt-a"]  # the same cluster
    now = [100.0]
    calls = []
    plain = world.handler

    def stalled(request: httpx.Request) -> httpx.Response:
        if request.url.host == "runtime-a.test":
            calls.append(request.url.path)
            raise httpx.ReadTimeout("no answer", request=request)
        return plain(request)

    world.handler = stalled  # type: ignore[method-assign]
    inner, runtime_access, kcp = tokenreview(world, clock=lambda: now[0])
    with pytest.raises(RuntimeApiSilent):  # the use case tells the mw: no measure of its limit
        await inner.verify(runtime_id="RT-A", headers=bearer(sa_token()))
    for runtime_id in ("RT-A", "RT-B"):
        with pytest.raises(ControlPlaneUnavailable) as caught:
            await inner.verify(runtime_id=runtime_id, headers=bearer(sa_token()))
        assert caught.value.retry_after is not None
        assert caught.value.retry_after <= 10
    assert len(calls) == 1  # answered at once, for every runtime of that cluster
    now[0] += 10.1
    with pytest.raises(ControlPlaneUnavailable):
        await inner.verify(runtime_id="RT-B", headers=bearer(sa_token()))
    assert len(calls) == 2  # asked again after the memory
    await runtime_access.aclose()
    await kcp.aclose()


# --- item 1: the mw's share per runtime ID and its limit ---------------------------------------


def http(runtime: str) -> Scope:
    return {"type": "http", "method": "POST", "path": f"/v1/runtimes/{runtime}/token"}


async def receive() -> Message:
    return {"type": "http.disconnect"}


class App:
    def __init__(self) -> None:
        self.inside: list[str] = []
        self.leave: list[Callable[[], None] | None] = []
        self.go = asyncio.Event()
        self.stall: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = scope["path"].split("/")[3]
        self.inside.append(runtime)
        self.leave.append(release_first_contact_place(scope))
        checked = identity_checked(scope, give_place_up=False)
        if runtime in self.stall:
            await self.go.wait()
            if checked is not None:  # it held a place: a request walking past holds none
                checked(timed_out=True)  # as the use case does after its check timed out


async def test_one_runtime_id_holds_at_most_its_share_of_the_first_contact_limit() -> None:
    app = App()
    app.stall.add("stalled")
    sent: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    mw = FirstContactLimitMiddleware(
        app, capacity=8, per_runtime=2, is_known=lambda _: False, max_wait=5.0
    )
    attackers = [asyncio.create_task(mw(http("stalled"), receive, send)) for _ in range(48)]
    await until(lambda: app.inside.count("stalled") == 2)
    assert mw.waiting == 0  # the others wait in the runtime's own line, not the shared one
    legit = [asyncio.create_task(mw(http(f"rt-{i}"), receive, send)) for i in range(20)]
    await until(lambda: sum(t.done() for t in legit) == 20)
    assert sorted(r for r in app.inside if r != "stalled") == sorted(f"rt-{i}" for i in range(20))
    assert app.inside.count("stalled") == 2
    hold_before = mw.limit.hold
    app.go.set()
    await asyncio.gather(*attackers)
    assert mw.limit.hold <= hold_before  # stalled holds were not learned from
    assert mw.runtime_queues() == 0


async def test_a_runtime_proven_while_its_requests_waited_walks_past() -> None:
    app = App()
    app.stall.add("rt")
    known: set[str] = set()
    mw = FirstContactLimitMiddleware(app, capacity=4, per_runtime=1, is_known=lambda r: r in known)

    async def send(_: Message) -> None:
        return None

    tasks = [asyncio.create_task(mw(http("rt"), receive, send)) for _ in range(25)]
    await until(lambda: len(app.inside) == 1)
    known.add("rt")  # the first proved the runtime
    leave = app.leave[0]
    assert leave is not None
    leave()
    await until(lambda: len(app.inside) == 25)
    app.go.set()
    await asyncio.gather(*tasks)


# --- item 3: state stays bounded, whatever IDs callers send -------------------------------------


class NoSecrets:
    """KCP without any kubeconfig Secret, at no cost (the bound is what is tested)."""

    server = "https://kcp.test"

    async def get_or_none(self, path: str) -> None:
        return None


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _grown(feed: Callable[[range], Any], first: int, total: int) -> int:
    """Growth of the resident memory while feeding IDs `first`..`total` after the first ones
    (the bounds are reached by then: what follows must replace, not add)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(feed(range(first)))
        gc.collect()
        before = _rss()
        loop.run_until_complete(feed(range(first, total)))
        gc.collect()
        return _rss() - before
    finally:
        loop.close()


def test_100000_distinct_runtime_ids_leave_memory_settled() -> None:
    # Runtime IDs with no kubeconfig Secret, as the identity check meets them once the Kyma
    # cache let them through (the worst case: every ID names a Kyma).
    runtime_access = RuntimeAccess(
        NoSecrets(),  # type: ignore[arg-type]
        namespace="kcp-system",
        secret_name_pattern="kubeconfig-{runtime_id}",
        ttl_seconds=60,
        clock=time.monotonic,
    )
    inner = TokenReviewVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        cache_max_seconds=60,
        clock=time.time,
    )
    token = bearer(sa_token())

    async def feed(ids: range) -> None:
        for i in ids:
            with pytest.raises(IdentityNotProven):
                await inner.verify(runtime_id=f"rt-{i}", headers=token)

    grown = _grown(feed, 40_000, 100_000)
    # Before: ~500 bytes per ID, never evicted (negative entries with their traceback): 30 MB.
    assert grown < 4_000_000, f"{grown} bytes more for 60,000 more IDs"


def test_the_screens_state_and_the_budgets_are_bounded() -> None:
    runtime_access = RuntimeAccess(
        NoSecrets(),  # type: ignore[arg-type]
        namespace="kcp-system",
        secret_name_pattern="kubeconfig-{runtime_id}",
        ttl_seconds=60,
        clock=time.monotonic,
        max_runtimes=1000,
    )
    inner = TokenReviewVerifier(
        runtime_access,
        audience="compass-broker",
        allowed=ALLOWED,
        cache_max_seconds=60,
        clock=time.time,
    )
    verifier = Screened(
        Kymas(everyone=True),
        IdentityBudget(
            inner,
            budget=BucketPolicy(burst=3, per_second=0.1),
            per_runtime=2,
            clock=time.monotonic,
            max_runtimes=1000,
            max_proven=1000,
        ),
    )
    limiter = RateLimiter(BucketPolicy(burst=1, per_second=0.001), max_keys=1000)
    token = bearer(sa_token())

    async def feed() -> None:
        for i in range(20_000):
            with pytest.raises(IdentityNotProven):
                await verifier.verify(runtime_id=f"rt-{i}", headers=token)
            limiter.try_take(f"rt-{i}", 0.0)

    asyncio.run(feed())
    assert len(runtime_access._entries) <= 1000
    assert verifier.tracked() <= 1000
    assert len(limiter) <= 1000
