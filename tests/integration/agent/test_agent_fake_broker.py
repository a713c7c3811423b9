"""The agent against a real runtime API server and a scripted broker (timing and failures)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise

import httpx
import pytest

from agent.cluster_objects import EXPIRES_AT_ANNOTATION, ISSUED_AT_ANNOTATION
from agent.process import Overrides
from kubeapi import access_from_kubeconfig_file
from tests.integration.agent.conftest import (
    AgentEnv,
    FakeBroker,
    RecordingTransport,
    eventually,
    problem_reply,
    token_reply,
)


async def test_module_enabled_writes_the_secret_within_seconds(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        # Idle, the agent looks again only after an hour: once it has seen no Kyma, a secret
        # within the 20 s below can only come from the Kyma watch waking it (an event, not a
        # stopwatch on this machine).
        agent = await agent_env.start(agent_env.settings(broker.url, resync_period=3600.0))
        await eventually(lambda: agent.reconciler.last_plan, what="a turn without a Kyma")
        agent_env.put_kyma(modules=["application-connector"])
        data = await eventually(agent_env.secret_data, within=20, what="the token secret")
        assert data == {
            "CONNECTOR_URL": "https://connector.test/graphql",
            "TOKEN": "ott-1",
            "RUNTIME_ID": "compass-rt-1",
            "TENANT": "ga-1",
        }
        secret = agent_env.secret()
        assert secret.type == "Opaque"
        assert secret.metadata.labels["app.kubernetes.io/managed-by"] == "compass-agent"
        annotations = secret.metadata.annotations
        assert annotations["compass-agent.kyma-project.io/compass-runtime-id"] == "compass-rt-1"
        assert EXPIRES_AT_ANNOTATION in annotations
        assert ISSUED_AT_ANNOTATION in annotations
        assert "ott-1" not in str(annotations)
        assert broker.paths == [f"/v1/runtimes/{agent_env.runtime_id}/token"]
        assert broker.requests[0][2]["authorization"] == "Bearer fake-sa-token"
        await eventually(lambda: agent_env.events("TokenPulled"), what="a TokenPulled event")
    finally:
        await agent_env.stop_all()
        await broker.stop()


class Ceiling:
    """rng for full jitter that always picks the top of the range: delays become exact steps."""

    def uniform(self, a: float, b: float, /) -> float:
        return b


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


async def test_broker_down_at_first_backs_off_then_connects(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)  # port reserved, nothing listening yet
    recorder = RecordingTransport()
    settings = agent_env.settings(broker.url, backoff_base=0.2, backoff_cap=5.0)
    agent = await agent_env.start(settings, Overrides(broker_transport=recorder, rng=Ceiling()))
    # The waits the pull asks for, taken as it sleeps them (BrokerClient's sleep seam).
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)

    agent.broker._sleep = sleep
    agent_env.put_kyma(modules=["application-connector"])
    try:
        await eventually(lambda: len(recorder.sent) >= 5, within=20, what="five failed attempts")
        assert agent_env.secret() is None
        # 0.2, 0.4, 0.8, 1.6 s: the policy's steps (base 0.2 s, doubling, the jitter at its
        # ceiling), as the pull asked to sleep them...
        assert waits[:4] == pytest.approx([0.2, 0.4, 0.8, 1.6])
        # ...and waited: each attempt came no sooner than its wait after the one before (a
        # lower bound only: a busy machine makes gaps longer, never shorter).
        between = gaps(recorder.sent[:5])
        assert all(gap >= wait - 0.001 for gap, wait in zip(between, waits, strict=False)), between
        await broker.start()
        data = await eventually(agent_env.secret_data, within=15, what="the token secret")
        assert data["TOKEN"] == "ott-1"
        assert len(broker.requests) == 1
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_honours_retry_after_then_connects(agent_env: AgentEnv) -> None:
    def script(n: int) -> object:
        return (
            problem_reply(503, "urn:compass-unavailable", retry_after="2")
            if n <= 2
            else token_reply(n)
        )

    broker = FakeBroker(script)  # type: ignore[arg-type]
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, backoff_base=0.1, backoff_cap=0.5))
        agent_env.put_kyma(modules=["application-connector"])
        data = await eventually(agent_env.secret_data, within=20, what="the token secret")
        assert data["TOKEN"] == "ott-3"
        times = [t for t, _, _ in broker.requests]
        assert len(times) == 3
        # Our own backoff would have waited at most 0.5 s; the broker asked for 2 s.
        assert all(gap >= 1.9 for gap in gaps(times)), gaps(times)
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_connection_failed_with_expired_token_pulls_a_new_one(agent_env: AgentEnv) -> None:
    def script(n: int) -> object:
        # The first token expires almost at once; later ones are ordinary.
        return token_reply(n, expires_in=timedelta(seconds=1) if n == 1 else timedelta(hours=1))

    broker = FakeBroker(script)  # type: ignore[arg-type]
    await broker.start()
    try:
        settings = agent_env.settings(broker.url, handover_grace=600.0, connection_grace=600.0)
        await agent_env.start(settings)
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-1", what="token 1"
        )
        agent_env.set_connection("ConnectionFailed", error="token expired")
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-2", what="token 2"
        )
        await eventually(lambda: agent_env.events("ConnectionFailureSeen"), what="a failure event")
        assert len(broker.requests) == 2
        # The fresh token is not replaced while the (stale) failure is still reported.
        agent_env.set_connection("ConnectionFailed", error="still failing", attempt=False)
        agent_env.set_connection("Connected")
        count = len(broker.requests)
        await _quiet(3.0)
        assert len(broker.requests) == count == 2
        assert agent_env.secret_data()["TOKEN"] == "ott-2"  # type: ignore[index]
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_no_connection_after_grace_and_expiry_pulls_again(agent_env: AgentEnv) -> None:
    def script(n: int) -> object:
        return token_reply(n, expires_in=timedelta(seconds=1) if n == 1 else timedelta(hours=1))

    broker = FakeBroker(script)  # type: ignore[arg-type]
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, connection_grace=2.0))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-1", what="token 1"
        )
        written = time.monotonic()
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-2", what="token 2"
        )
        assert time.monotonic() - written >= 1.5  # not before the grace period was over
        count = len(broker.requests)
        await _quiet(2.5)
        assert len(broker.requests) == count == 2  # token 2 is valid for an hour: no more pulls
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_module_disabled_removes_secret_and_enabling_pulls_anew(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-1", what="token 1"
        )
        agent_env.put_kyma(modules=["istio"])
        await eventually(lambda: agent_env.secret() is None, what="the secret to go")
        await eventually(lambda: agent_env.events("SecretRemoved"), what="a SecretRemoved event")
        await _quiet(1.0)
        assert agent_env.secret() is None
        assert len(broker.requests) == 1
        agent_env.put_kyma(modules=["istio", "application-connector"])
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-2", what="token 2"
        )
        assert len(broker.requests) == 2
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_policy_can_keep_the_secret_on_disable(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, delete_secret_on_disable=False))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, what="the token secret")
        agent_env.put_kyma(modules=[])
        await _quiet(2.0)
        assert agent_env.secret() is not None
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_restart_while_connected_asks_for_nothing(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, what="the token secret")
        agent_env.set_connection("Synchronized")
        await agent_env.stop_all()
        assert len(broker.requests) == 1
        agent = await agent_env.start(agent_env.settings(broker.url))
        await eventually(agent.ready, what="the restarted agent to be ready")
        await _quiet(3.0)
        assert len(broker.requests) == 1
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_refused_asks_rarely_records_why_and_retries_on_change(agent_env: AgentEnv) -> None:
    broker = FakeBroker(lambda n: problem_reply(403, "urn:kyma-compass:forbidden"))
    await broker.start()
    try:
        # The cadence is the 10-minute default: within the 30 s window there is one request.
        await agent_env.start(agent_env.settings(broker.url))
        agent_env.put_kyma(modules=["application-connector"])
        events = await eventually(
            lambda: agent_env.events("PullRefused"), what="a PullRefused event"
        )
        assert "403" in events[0].message
        assert "urn:kyma-compass:forbidden" in events[0].message
        assert events[0].type == "Warning"
        await _quiet(30.0)
        assert 1 <= len(broker.requests) <= 3
        assert agent_env.secret() is None
        # A change to what it watches (here: the runtime's Kyma labels) earns one more try.
        before = len(broker.requests)
        agent_env.cluster.custom.patch_namespaced_custom_object(
            "operator.kyma-project.io", "v1beta2", agent_env.namespace, "kymas", "default",
            {"metadata": {"labels": {"kyma-project.io/global-account-id": "ga-2"}}},
        )  # fmt: skip
        await eventually(
            lambda: len(broker.requests) == before + 1, what="a retry after the change"
        )
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def _quiet(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def test_disabling_the_module_cancels_a_pull_in_flight(agent_env: AgentEnv) -> None:
    broker = FakeBroker(lambda n: problem_reply(503, "urn:compass-unavailable", retry_after="1"))
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, backoff_base=0.1, backoff_cap=0.5))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(lambda: len(broker.requests) >= 2, what="retries while unavailable")
        agent_env.put_kyma(modules=[])
        await _quiet(0.5)  # a request already on the wire may still land
        count = len(broker.requests)
        await _quiet(3.0)
        assert len(broker.requests) == count  # no token asked for once it is not needed
    finally:
        await agent_env.stop_all()
        await broker.stop()


class ApiServerTransport(httpx.AsyncBaseTransport):
    """The agent's own connection to the runtime API server, for a test to step into."""

    def __init__(self, agent_env: AgentEnv) -> None:
        access = access_from_kubeconfig_file(agent_env.cluster.kubeconfig_path)
        self.inner = httpx.AsyncHTTPTransport(verify=access.ssl_context())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ForbidSecretWrites(ApiServerTransport):
    """The agent's API server connection, except that writing a secret is forbidden (as with
    missing RBAC or an admission webhook saying no)."""

    def __init__(self, agent_env: AgentEnv) -> None:
        super().__init__(agent_env)
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method in ("POST", "PUT", "PATCH") and "/secrets" in request.url.path:
            self.refused += 1
            status = {"kind": "Status", "code": 403, "message": "forbidden by the test"}
            return httpx.Response(403, json=status)
        return await super().handle_async_request(request)


async def test_a_token_that_cannot_be_stored_does_not_start_a_pull_loop(
    agent_env: AgentEnv,
) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    forbid = ForbidSecretWrites(agent_env)
    try:
        settings = agent_env.settings(broker.url, backoff_base=1.0, backoff_cap=60.0)
        await agent_env.start(settings, Overrides(kube_transport=forbid, rng=Ceiling()))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(lambda: forbid.refused >= 1, what="a refused secret write")
        await _quiet(8.0)
        # Each token thrown away counts: the next waits 1 s, then 2 s, then 4 s... — about
        # four requests in these 8 s, not one per loop turn.
        assert 2 <= len(broker.requests) <= 5, len(broker.requests)
        between = gaps([t for t, _, _ in broker.requests])
        assert all(later > earlier * 1.5 for earlier, later in pairwise(between)), between
        assert agent_env.secret() is None
    finally:
        await agent_env.stop_all()
        await broker.stop()


class Held(ApiServerTransport):
    """The agent's API server connection, except that the requests `held` picks wait for
    `release`."""

    def __init__(self, agent_env: AgentEnv, held: Callable[[httpx.Request], bool]) -> None:
        super().__init__(agent_env)
        self.held = held
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.held(request):
            self.holding.set()
            await self.release.wait()
        return await super().handle_async_request(request)


async def test_a_turn_during_the_secret_write_does_not_throw_the_token_away(
    agent_env: AgentEnv,
) -> None:
    # Seen in CI: the token arrived, and while its secret was being written a turn (woken by a
    # connection report) planned "wait out the pull spacing" — the token counts as received
    # before it is written — and cancelled the task that was writing it; a second token followed.
    broker = FakeBroker(token_reply)
    await broker.start()
    held = Held(agent_env, lambda r: r.method in ("POST", "PUT") and "/secrets" in r.url.path)
    try:
        agent = await agent_env.start(
            agent_env.settings(broker.url), Overrides(kube_transport=held)
        )
        agent_env.put_kyma(modules=["application-connector"])
        await asyncio.wait_for(held.holding.wait(), timeout=10)
        turns = agent.reconciler.turns
        agent.reconciler.trigger()
        await eventually(lambda: agent.reconciler.turns > turns, what="a turn during the write")
        held.release.set()
        data = await eventually(agent_env.secret_data, within=10, what="the token secret")
        assert data["TOKEN"] == "ott-1"
        await _quiet(1.0)
        assert len(broker.requests) == 1, broker.paths
    finally:
        held.release.set()
        await agent_env.stop_all()
        await broker.stop()


async def test_not_ready_until_the_lease_is_decided(agent_env: AgentEnv) -> None:
    # Seen in CI: ready as a "standby" before the first lease attempt, then not ready ("no
    # reconcile turn yet") the moment the lease turned out to be ours.
    held = Held(agent_env, lambda r: "/leases" in r.url.path)
    try:
        agent = await agent_env.start(
            agent_env.settings("http://127.0.0.1:9"), Overrides(kube_transport=held)
        )
        await asyncio.wait_for(held.holding.wait(), timeout=10)
        await eventually(lambda: all(w.synced for w in agent.watchers), what="the watches to sync")
        assert agent.ready() == (False, "lease not tried yet")
        held.release.set()
        await eventually(lambda: agent.ready()[0], what="ready once leading and turned")
        assert agent.leading.is_set()
        assert agent.reconciler.last_plan is not None
    finally:
        held.release.set()
        await agent_env.stop_all()
