"""The agent with the real broker (own process) and the Compass simulator, on real API servers.

The runtime is `runtime_a`; the broker verifies the agent's ServiceAccount token with a
TokenReview against `runtime_a` via the kubeconfig secret seeded in the control plane.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from agent.process import Overrides
from devenv.clusters import TestCluster
from devenv.compass_sim import DownMode
from tests.integration.agent.conftest import AgentEnv, RecordingTransport, eventually
from tests.integration.broker.conftest import (
    AUDIENCE,
    GROUP,
    BrokerFactory,
    Runtime,
    seed_runtime,
)

REVOKED = "compass-broker.kyma-project.io/revoked"


def prepare(agent_env: AgentEnv, control_plane: TestCluster, kcp_ns: str) -> Runtime:
    runtime = seed_runtime(control_plane, kcp_ns, agent_env.cluster)
    agent_env.runtime_id = runtime.runtime_id
    return runtime


def token_file(agent_env: AgentEnv, runtime: Runtime, *, audience: str = AUDIENCE) -> Path:
    path = agent_env.workdir / f"projected-{audience}"
    path.write_text(runtime.token(audience=audience))
    return path


def tokens_issued(sim: Any, runtime: Runtime) -> int:
    return sum(1 for t in sim.connector_tokens() if t.tenant == runtime.tenant)


async def test_real_broker_writes_a_working_secret_from_the_projected_token(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers()
    settings = agent_env.settings(
        broker.url, sa_token_file=token_file(agent_env, runtime), audience=AUDIENCE
    )
    await agent_env.start(settings)
    agent_env.put_kyma(modules=["application-connector"])
    data = await eventually(agent_env.secret_data, within=20, what="the token secret")
    assert set(data) == {"CONNECTOR_URL", "TOKEN", "RUNTIME_ID", "TENANT"}
    assert data["TENANT"] == runtime.tenant
    assert data["CONNECTOR_URL"] == sim.connector_url
    registered = sim.runtimes(runtime.tenant)
    assert [r.id for r in registered] == [data["RUNTIME_ID"]]
    assert tokens_issued(sim, runtime) == 1
    annotations = agent_env.secret().metadata.annotations
    assert annotations["compass-agent.kyma-project.io/compass-runtime-id"] == data["RUNTIME_ID"]


async def test_token_request_fallback_works_against_the_real_api_server(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers()
    settings = agent_env.settings(
        broker.url,
        sa_token_file=agent_env.workdir / "no-such-file",
        service_account="compass-agent",
        service_account_namespace="kyma-system",
        audience=AUDIENCE,
    )
    await agent_env.start(settings)
    agent_env.put_kyma(modules=["application-connector"])
    data = await eventually(agent_env.secret_data, within=20, what="the token secret")
    assert data["TENANT"] == runtime.tenant
    assert tokens_issued(sim, runtime) == 1


async def test_wrong_audience_is_refused_and_said_in_an_event(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers()
    wrong = token_file(agent_env, runtime, audience="someone-else")
    await agent_env.start(agent_env.settings(broker.url, sa_token_file=wrong, audience=AUDIENCE))
    agent_env.put_kyma(modules=["application-connector"])
    events = await eventually(lambda: agent_env.events("PullRefused"), within=20, what="refusal")
    assert "401" in events[0].message
    assert agent_env.secret() is None
    assert tokens_issued(sim, runtime) == 0


async def test_director_down_honours_retry_after_then_connects(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers()
    sim.update_faults(down=DownMode.UNAVAILABLE, down_retry_after_seconds=2)
    recorder = RecordingTransport()
    settings = agent_env.settings(
        broker.url,
        sa_token_file=token_file(agent_env, runtime),
        backoff_base=0.1,
        backoff_cap=0.5,
    )
    await agent_env.start(settings, Overrides(broker_transport=recorder))
    agent_env.put_kyma(modules=["application-connector"])
    await eventually(lambda: len(recorder.answers) >= 3, within=30, what="three refused attempts")
    assert agent_env.secret() is None
    sim.clear_faults()
    data = await eventually(agent_env.secret_data, within=30, what="the token secret")
    assert data["TENANT"] == runtime.tenant
    answers = list(recorder.answers)
    unavailable = [(t, ra) for t, status, ra in answers if status == 503]
    assert unavailable, answers
    # After each 503 the next request waited at least the Retry-After the broker sent
    # (our own backoff alone would have been at most 0.5 s).
    for (answered, _status, retry_after), sent in zip(answers, recorder.sent[1:], strict=False):
        if retry_after is not None:
            assert sent - answered >= float(retry_after) - 0.05, (retry_after, sent - answered)
    assert any(ra is not None and float(ra) >= 1 for _, ra in unavailable)


async def test_restart_while_connected_issues_no_new_token(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers()
    settings = agent_env.settings(broker.url, sa_token_file=token_file(agent_env, runtime))
    await agent_env.start(settings)
    agent_env.put_kyma(modules=["application-connector"])
    await eventually(agent_env.secret_data, within=20, what="the token secret")
    agent_env.set_connection("Connected")
    await agent_env.stop_all()
    issued = tokens_issued(sim, runtime)
    assert issued == 1
    agent = await agent_env.start(settings)
    await eventually(agent.ready, what="the restarted agent to be ready")
    await asyncio.sleep(3)
    assert tokens_issued(sim, runtime) == issued
    assert agent.metrics.pull_attempts.labels(outcome="issued")._value.get() == 0


def mapping(control_plane: TestCluster, kcp_ns: str, runtime: Runtime) -> dict[str, Any]:
    found: dict[str, Any] = control_plane.custom.get_namespaced_custom_object(
        GROUP, "v1beta1", kcp_ns, "compassmanagermappings", runtime.kyma_name
    )
    return found


def connection_of(control_plane: TestCluster, kcp_ns: str, runtime: Runtime) -> dict[str, Any]:
    status = mapping(control_plane, kcp_ns, runtime).get("status") or {}
    return dict(status.get("connection") or {})


async def test_reports_reach_the_mapping_and_a_revocation_stops_the_agent_until_lifted(
    agent_env: AgentEnv, brokers: BrokerFactory, control_plane: TestCluster, kcp_ns: str, sim: Any
) -> None:
    runtime = prepare(agent_env, control_plane, kcp_ns)
    broker = brokers(BROKER_REPORT_MIN_INTERVAL_SECONDS="0.5")
    settings = agent_env.settings(
        broker.url,
        sa_token_file=token_file(agent_env, runtime),
        report_interval_seconds=2,
        revoked_recheck_seconds=2,
    )
    agent = await agent_env.start(settings)
    agent_env.put_kyma(modules=["application-connector"])
    data = await eventually(agent_env.secret_data, within=20, what="the token secret")

    # The runtime agent connects: the agent reports it, the broker records it on the mapping.
    agent_env.set_connection("Connected")
    await eventually(
        lambda: connection_of(control_plane, kcp_ns, runtime).get("state") == "Connected",
        within=20,
        what="Connected recorded on the mapping",
    )
    recorded = connection_of(control_plane, kcp_ns, runtime)
    assert recorded["tokenSha256"] == hashlib.sha256(data["TOKEN"].encode()).hexdigest()
    conditions = mapping(control_plane, kcp_ns, runtime)["status"]["conditions"]
    assert {"type": "Connected", "status": "True"}.items() <= next(
        c for c in conditions if c["type"] == "Connected"
    ).items()
    seen = max((r.seq for r in sim.request_log()), default=0)

    agent_env.set_connection("ConnectionFailed", error="certificate expired")
    await eventually(
        lambda: connection_of(control_plane, kcp_ns, runtime).get("state") == "ConnectionFailed",
        within=20,
        what="the failure recorded",
    )
    assert connection_of(control_plane, kcp_ns, runtime)["lastError"] == "certificate expired"

    # An operator revokes it: the agent is refused, says why, keeps the secret.
    # (The failure above makes the agent pull a fresh token first; let that settle.)
    await eventually(
        lambda: agent.metrics.pull_attempts.labels(outcome="issued")._value.get() >= 2,
        within=20,
        what="the token pulled after the failure",
    )
    control_plane.custom.patch_namespaced_custom_object(
        GROUP,
        "v1beta1",
        kcp_ns,
        "compassmanagermappings",
        runtime.kyma_name,
        {"metadata": {"annotations": {REVOKED: "compromised"}}},
    )
    events = await eventually(
        lambda: agent_env.events("RuntimeRevoked"), within=20, what="RuntimeRevoked in the runtime"
    )
    assert "compromised" in events[0].message
    kept = agent_env.secret_data()  # (the failure above made the agent pull a fresh token)
    assert kept is not None
    assert kept["RUNTIME_ID"] == data["RUNTIME_ID"]
    assert agent.metrics.revoked._value.get() == 1

    # Lifted: the next re-check gets a token again.
    control_plane.custom.patch_namespaced_custom_object(
        GROUP,
        "v1beta1",
        kcp_ns,
        "compassmanagermappings",
        runtime.kyma_name,
        {"metadata": {"annotations": {REVOKED: None}}},
    )
    await eventually(
        lambda: agent.metrics.revoked._value.get() == 0, within=20, what="the revocation lifted"
    )
    # Reports cost Director nothing; only the re-check's token did.
    later = sim.request_log(since_seq=seen)
    assert {r.operation for r in later if r.endpoint == "director"} <= {
        "requestOneTimeTokenForRuntime"
    }
