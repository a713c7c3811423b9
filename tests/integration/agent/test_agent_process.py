"""Process-level behaviour: single active instance (Lease), probes and metrics, BYOC signals,
and `python -m agent` shutting down cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from kubernetes import client

from tests.integration.agent.conftest import AgentEnv, FakeBroker, eventually, token_reply


async def test_only_the_lease_holder_acts_and_a_successor_takes_over(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        first = await agent_env.start(agent_env.settings(broker.url, identity="first"))
        await eventually(first.leading.is_set, what="the first agent to lead")
        second = await agent_env.start(agent_env.settings(broker.url, identity="second"))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, what="the token secret")
        await asyncio.sleep(2)
        assert len(broker.requests) == 1  # one active instance pulled, the standby did not
        assert not second.leading.is_set()
        # The leader stops (and hands the lease back); the standby takes over and acts.
        running = agent_env.running.pop(0)
        await running.stop()
        await eventually(second.leading.is_set, within=10, what="the successor to lead")
        agent_env.cluster.core.delete_namespaced_secret(
            "compass-agent-configuration", agent_env.namespace
        )
        await eventually(lambda: len(broker.requests) == 2, what="a pull by the successor")
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_probes_and_metrics(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        agent = await agent_env.start(agent_env.settings(broker.url))
        base = f"http://127.0.0.1:{agent.health.port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
            await eventually(lambda: agent.ready()[0], what="the watches to sync")
            assert (await http.get("/readyz")).status_code == 200
            agent_env.put_kyma(modules=["application-connector"])
            await eventually(agent_env.secret_data, what="the token secret")

            async def scraped() -> str:
                return (await http.get("/metrics")).text

            text = await scraped()
            for _ in range(50):
                if 'compass_agent_state{compass_agent_state="waiting-for-connection"} 1.0' in text:
                    break
                await asyncio.sleep(0.1)
                text = await scraped()
        assert 'compass_agent_pull_attempts_total{outcome="issued"} 1.0' in text
        assert 'compass_agent_pull_attempts_total{outcome="temporary"} 0.0' in text
        assert "compass_agent_last_success_timestamp_seconds 0.0" not in text
        assert 'compass_agent_state{compass_agent_state="waiting-for-connection"} 1.0' in text
        assert "ott-1" not in text
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_byoc_application_connector_cr_and_configured_runtime_id(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        settings = agent_env.settings(broker.url, runtime_id="byoc-runtime-7")
        await agent_env.start(settings)
        await asyncio.sleep(1)
        assert broker.requests == []  # nothing enabled yet: nothing asked
        agent_env.put_application_connector()
        await eventually(agent_env.secret_data, what="the token secret")
        assert broker.paths == ["/v1/runtimes/byoc-runtime-7/token"]
        agent_env.delete_application_connector()
        await eventually(lambda: agent_env.secret() is None, what="the secret to go")
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_kyma_label_wins_over_configured_runtime_id(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, runtime_id="configured"))
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, what="the token secret")
        assert broker.paths == [f"/v1/runtimes/{agent_env.runtime_id}/token"]
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_module_signal_setting_limits_what_counts(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        await agent_env.start(agent_env.settings(broker.url, module_signals="kyma-spec"))
        agent_env.put_kyma(modules=[])
        agent_env.put_application_connector()
        await asyncio.sleep(2)
        assert broker.requests == []  # an ApplicationConnector CR does not count here
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, what="the token secret")
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_process_runs_and_stops_cleanly_on_sigterm(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(
        AGENT_BROKER_URL=broker.url,
        AGENT_NAMESPACE=agent_env.namespace,
        AGENT_KUBECONFIG=str(agent_env.cluster.kubeconfig_path),
        AGENT_SA_TOKEN_FILE=str(agent_env.workdir / "sa-token"),
        AGENT_HEALTH_ADDRESS="127.0.0.1:0",
        AGENT_IDENTITY="process",
    )
    (agent_env.workdir / "sa-token").write_text("process-sa-token")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        agent_env.put_kyma(modules=["application-connector"])
        await eventually(agent_env.secret_data, within=20, what="the token secret")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), timeout=20)
        assert proc.stderr is not None
        logs = (await proc.stderr.read()).decode()
        assert code == 0, logs
        assert '"msg": "agent stopped"' in logs
        assert "ott-1" not in logs
        assert "process-sa-token" not in logs
        # The lease was handed back on the way out.
        lease = client.CoordinationV1Api(agent_env.cluster.api_client).read_namespaced_lease(
            "compass-agent", agent_env.namespace
        )
        assert not lease.spec.holder_identity
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await broker.stop()


def test_help_lists_settings() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agent", "--help"], capture_output=True, text=True, check=True
    )
    assert "AGENT_BROKER_URL" in out.stdout
    assert "AGENT_MODULE_SIGNALS" in out.stdout


def test_a_kubeconfig_with_an_exec_plugin_stops_the_agent_with_its_reason(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {exec: {command: touch, args: [ran]}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    env = {
        **os.environ,
        "AGENT_BROKER_URL": "http://127.0.0.1:1",
        "AGENT_KUBECONFIG": str(kubeconfig),
    }
    out = subprocess.run(
        [sys.executable, "-m", "agent"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"compass-agent: AGENT_KUBECONFIG ({kubeconfig}): "), line
    assert "exec" in line
    assert not (tmp_path / "ran").exists()


async def test_healthz_fails_when_a_watch_task_is_gone(agent_env: AgentEnv) -> None:
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        agent = await agent_env.start(agent_env.settings(broker.url))
        await eventually(agent.ready, what="the watches to sync")
        base = f"http://127.0.0.1:{agent.health.port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
            # A watcher only ends by dying; the agent would be deaf to that kind from then on.
            watch_task = next(t for t in asyncio.all_tasks() if t.get_name() == "watch-kyma")
            watch_task.cancel()
            await eventually(watch_task.done, what="the watch task to end")
            assert (await http.get("/healthz")).status_code == 500
    finally:
        await agent_env.stop_all()
        await broker.stop()
