"""The agent's own footprint: the real agent (`python -m agent`) against a real runtime API
server and a broker, connected, then idle. CPU and memory from /proc of the agent's PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bench.keys import RuntimeKey
from bench.procs import python_child, sample
from bench.progress import Progress
from bench.results import FootprintResult
from bench.stack import Simulator, kyma_object


async def measure_footprint(
    *,
    runtime_cluster: Any,
    key: RuntimeKey,
    token: str,
    broker_url: str,
    sim: Simulator,
    workdir: Path,
    idle_seconds: float,
    progress: Progress,
) -> FootprintResult:
    """The real agent pulls a token, the CompassConnection is set `Connected`, then it idles."""
    await asyncio.to_thread(prepare_runtime, runtime_cluster, key)
    token_file = workdir / "agent-token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(
        {
            "AGENT_BROKER_URL": broker_url,
            "AGENT_KUBECONFIG": str(runtime_cluster.kubeconfig_path),
            "AGENT_SA_TOKEN_FILE": str(token_file),
            "AGENT_HEALTH_ADDRESS": "127.0.0.1:0",
            "AGENT_IDENTITY": "bench-agent",
        }
    )
    agent = python_child("compass-agent", "agent", env=env, log_path=workdir / "agent.log")
    try:
        started = time.monotonic()
        await asyncio.to_thread(wait_for_secret, runtime_cluster, agent, 120.0)
        connect_seconds = time.monotonic() - started
        await asyncio.to_thread(report_connected, runtime_cluster)
        await asyncio.sleep(5)  # let it see the CompassConnection and settle
        progress.say(f"footprint: agent connected, idle for {idle_seconds:.0f}s")
        before = sample(agent.pid)
        idle_started = time.monotonic()
        await asyncio.sleep(idle_seconds)
        after = sample(agent.pid)
        idle = time.monotonic() - idle_started
        if not agent.alive():
            raise RuntimeError(f"the agent exited:\n{agent.tail()}")
    finally:
        agent.stop()
    async with httpx.AsyncClient(timeout=30) as http:
        await sim.poll_calls(http)
    pulls = sum(1 for c in sim.calls if c.operation == "requestOneTimeTokenForRuntime")
    return FootprintResult(
        idle_seconds=idle,
        cpu_seconds=after.cpu_seconds - before.cpu_seconds,
        peak_rss_bytes=after.peak_rss_bytes,
        rss_bytes_end=after.rss_bytes,
        connect_seconds=connect_seconds,
        pulls=pulls,
    )


AGENT_NS = "kyma-system"


def prepare_runtime(cluster: Any, key: RuntimeKey) -> None:
    """The runtime side as KLM leaves it: Kyma `kyma-system/default` with the module on."""
    cluster.create_namespace(AGENT_NS)
    body = kyma_object(AGENT_NS, 0, key)
    body["metadata"]["name"] = "default"
    labels = body["metadata"]["labels"]
    body["metadata"]["labels"] = {
        k: v
        for k, v in labels.items()
        if k
        in (
            "kyma-project.io/runtime-id",
            "kyma-project.io/global-account-id",
            "kyma-project.io/subaccount-id",
        )
    }
    with contextlib.suppress(ApiException):
        cluster.custom.delete_namespaced_custom_object(
            "operator.kyma-project.io", "v1beta2", AGENT_NS, "kymas", "default"
        )
    cluster.custom.create_namespaced_custom_object(
        "operator.kyma-project.io", "v1beta2", AGENT_NS, "kymas", body
    )


def wait_for_secret(cluster: Any, agent: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    core: k8s.CoreV1Api = cluster.core
    while time.monotonic() < deadline:
        if not agent.alive():
            raise RuntimeError(f"the agent exited:\n{agent.tail()}")
        try:
            core.read_namespaced_secret("compass-agent-configuration", AGENT_NS)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        time.sleep(0.2)
    raise RuntimeError(f"the agent wrote no token secret within {timeout:.0f}s:\n{agent.tail()}")


def report_connected(cluster: Any) -> None:
    """What compass-runtime-agent does once it used the token: CompassConnection Connected."""
    group, version = "compass.kyma-project.io", "v1alpha1"
    plural, name = "compassconnections", "compass-connection"
    custom: k8s.CustomObjectsApi = cluster.custom
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(
            group,
            version,
            plural,
            {
                "apiVersion": f"{group}/{version}",
                "kind": "CompassConnection",
                "metadata": {"name": name},
                "spec": {"managementInfo": {"connectorUrl": "", "directorUrl": ""}},
            },
        )
    custom.patch_cluster_custom_object(  # no status subresource in the published CRD
        group,
        version,
        plural,
        name,
        {"status": {"connectionState": "Connected", "connectionStatus": {"certificateStatus": {}}}},
    )
