"""Watches resume after the connection to the API server drops.

The agent reaches the real runtime API server through a local TCP proxy; the test cuts every
connection (RST, as a restarting API server or a broken path would) several times and then
shows the agent still reacts to a change at once — through its watches, not the resync timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from agent.process import Agent, Overrides
from tests.integration.agent.conftest import (
    AgentEnv,
    FakeBroker,
    eventually,
    token_reply,
)
from tests.integration.agent.test_agent_fake_broker import Ceiling
from tests.integration.tcp_proxy import TcpProxy


def proxied_kubeconfig(agent_env: AgentEnv, proxy: TcpProxy, folder: Path) -> Path:
    doc = yaml.safe_load(agent_env.cluster.kubeconfig_path.read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path = folder / "proxied.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def relisted_since(agent: Agent, before: dict[str, int]) -> Callable[[], bool]:
    return lambda: all(w.relists > before[w.name] for w in agent.watchers)


async def test_watches_resume_after_the_api_server_connection_drops(
    agent_env: AgentEnv, tmp_path: Path
) -> None:
    target = urlsplit(agent_env.cluster.server)
    assert target.hostname is not None
    assert target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    await proxy.start()
    broker = FakeBroker(token_reply)
    await broker.start()
    try:
        settings = agent_env.settings(
            broker.url,
            kubeconfig=proxied_kubeconfig(agent_env, proxy, tmp_path),
            lease_enabled=False,
            resync_period=600.0,  # only a watch event can wake the loop within the test
            backoff_base=1.0,
            backoff_cap=60.0,
        )
        # Ceiling: every backoff is its full step (1 s, 2 s, 4 s, 8 s...), no luck involved.
        agent = await agent_env.start(settings, Overrides(rng=Ceiling()))
        await eventually(agent.ready, within=15, what="the watches to sync")
        for cut in range(1, 5):
            # Let every watcher get from its re-list to an open watch stream, so the cut
            # catches all of them mid-watch.
            await asyncio.sleep(1.5)
            before = {w.name: w.relists for w in agent.watchers}
            proxy.cut()
            # Each drop is a new outage: re-listed after the first backoff step (1 s), so
            # the fourth drop is not waited out for 8 s.
            await eventually(
                relisted_since(agent, before),
                within=6,
                what=f"every watch to re-list after cut {cut}",
            )
        assert agent.healthy()
        await asyncio.sleep(1.0)  # the re-opened watch streams are idle now
        assert agent_env.secret() is None
        assert broker.requests == []
        agent_env.put_kyma(modules=["application-connector"])
        data = await eventually(agent_env.secret_data, within=10, what="the token secret")
        assert data["TOKEN"] == "ott-1"
        assert proxy.cuts == 4
    finally:
        await agent_env.stop_all()
        await broker.stop()
        await proxy.stop()
