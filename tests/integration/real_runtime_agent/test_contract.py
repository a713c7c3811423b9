"""One scenario, two compass-runtime-agents: our stand-in (`devenv/runtime_agent_sim.py`) and
Kyma's real one, each reading what our agent writes and talking to the simulated Compass
(token-secured Connector, then the certificate-secured Connector and Director over mTLS).

The scenario: the runtime agent starts before the module is enabled (no Secret: it fails for
that); first connection (module enabled -> one token -> `Synchronized`); a spent token (the
CompassConnection deleted: it starts over with the token it used -> `ConnectionFailed` -> our
agent pulls exactly one fresh token -> `Synchronized`); the Secret deleted (one new token, still
`Synchronized`). Per phase it records the states the CompassConnection passed through, the
Secrets written (their keys), the Director one-time tokens and every Connector / certificate-
secured call; `CONTRACT` is what both must show, and the two runs are compared with it. The
stand-in runs as its own process under the real agent's ServiceAccount and RBAC, at a short
sync period (the behaviour, not the minutes, is the contract); the real one at the period the
other real-agent test uses. Without the real agent's source (or root) its run skips and says why.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from devenv import runtime_agent
from devenv.clusters import TestCluster
from devenv.runtime_agent.landscape import Handover

pytestmark = pytest.mark.timeout(900)

REPO_ROOT = Path(__file__).resolve().parents[3]
CA_NAMESPACE, CA_NAME = runtime_agent.CA_SECRET.split("/", 1)


@dataclass(frozen=True)
class Timing:
    sync_period: float
    minimal_sync: float

    @property
    def synced_within(self) -> float:
        # The first resync comes about two (jittered) periods after start.
        return 2 * 1.1 * self.sync_period + 30


SIM = Timing(sync_period=6.0, minimal_sync=3.0)
REAL = Timing(sync_period=40.0, minimal_sync=15.0)


@dataclass
class Phase:
    states: list[str] = field(default_factory=list)
    tokens: int = 0
    connector: dict[str, int] = field(default_factory=dict)
    secured_ops: set[str] = field(default_factory=set)
    labels_set: int = 0


@dataclass
class Run:
    phases: dict[str, Phase] = field(default_factory=dict)
    secrets: dict[str, list[str] | None] = field(default_factory=dict)
    management_info: dict[str, bool] = field(default_factory=dict)
    crt_is_client_only: bool = False
    key_bits: int = 0


# What both runtime agents must show, phase by phase (states: the distinct states in order).
CONTRACT = {
    "no secret": Phase(states=["ConnectionFailed"], tokens=0),
    "first connection": Phase(
        states=["ConnectionFailed", "Connected", "Synchronized"],
        tokens=1,
        connector={"configuration": 1, "signCertificateSigningRequest": 1},
        secured_ops={"configuration", "runtime", "applicationsForRuntime", "setRuntimeLabel"},
        labels_set=2,
    ),
    "spent token": Phase(
        states=["Synchronized", "ConnectionFailed", "Connected", "Synchronized"],
        tokens=1,
        # one refused try with the spent token, then the fresh one's two calls
        connector={"configuration": 2, "signCertificateSigningRequest": 1},
        secured_ops={"configuration", "runtime", "applicationsForRuntime"},
        labels_set=0,
    ),
    # No token exchange while Synchronized; a Director sync in the moment the Secret was gone
    # may fail (SynchronizationFailed) and the next one succeed: both agents may show that.
    "secret deleted": Phase(states=["Synchronized"], tokens=1, connector={}),
}
SECRETS = {
    "kyma-system/cluster-client-certificates": ["crt", "crtChain", "key"],
    runtime_agent.CA_SECRET: ["cacert"],
}


class Recorder:
    """Polls the CompassConnection's state every 0.2 s and keeps the distinct states seen."""

    def __init__(self, h: Handover) -> None:
        self.h = h
        self.states: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Recorder:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _poll(self) -> None:
        while True:
            self.note(await asyncio.to_thread(self.h.state))
            await asyncio.sleep(0.2)

    def note(self, state: str | None) -> None:
        if state and (not self.states or self.states[-1] != state):
            self.states.append(state)

    def take(self) -> list[str]:
        self.note(self.h.state())  # the state waited for, even if the last poll came before
        taken, self.states = self.states, self.states[-1:]
        return taken


async def until(condition: Callable[[], object], within: float, what: str, log: str = "") -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s\n{log}")
        await asyncio.sleep(0.2)


def _diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


async def run_scenario(
    cluster: TestCluster, workdir: Path, timing: Timing, start: Callable[[], Any]
) -> Run:
    """Starts the runtime agent with `start()` (returns something with `log_tail()`), plays
    the scenario and returns what it saw."""
    run = Run()
    settings = {
        "handover_grace": 600.0,  # only the observed try may replace a token
        "connection_grace": 600.0,
        "runtime_agent_min_sync": timing.minimal_sync + 1,
        "report_interval_seconds": 3600.0,
    }
    async with Handover(
        cluster, workdir / "landscape", "kyma-contract", agent_settings=settings
    ) as h:
        for namespace, name in (
            ("kyma-system", "cluster-client-certificates"),
            (CA_NAMESPACE, CA_NAME),
        ):
            h.cluster.create_namespace(namespace)
            if h.secret_keys(namespace, name) is not None:
                h.cluster.core.delete_namespaced_secret(name, namespace)
        agent = start()
        tail = agent.log_tail
        async with Recorder(h) as seen:

            def snapshot() -> tuple[int, dict[str, int], dict[str, int]]:
                return h.tokens_issued(), h.connector_calls(), h.secured_calls()

            def phase(before: tuple[int, dict[str, int], dict[str, int]]) -> Phase:
                tokens, connector, secured = snapshot()
                calls = _diff(before[2], secured)
                return Phase(
                    states=seen.take(),
                    tokens=tokens - before[0],
                    connector=_diff(before[1], connector),
                    secured_ops=set(calls),
                    labels_set=calls.get("setRuntimeLabel", 0),
                )

            before = snapshot()
            await until(lambda: h.state() == "ConnectionFailed", 60, "no secret", tail())
            run.phases["no secret"] = phase(before)

            before = snapshot()
            h.enable_module()
            await until(lambda: h.state() == "Synchronized", timing.synced_within, "first", tail())
            run.phases["first connection"] = phase(before)
            info = (h.connection() or {})["spec"]["managementInfo"]
            run.management_info = {
                "connectorUrl": info["connectorUrl"] == f"{h.secured.url}/connector/graphql",
                "directorUrl": info["directorUrl"] == f"{h.secured.url}/director/graphql",
            }

            before = snapshot()
            h.delete_connection()
            await until(lambda: h.state() == "ConnectionFailed", 60, "spent token", tail())
            await until(lambda: h.state() == "Synchronized", timing.synced_within, "again", tail())
            run.phases["spent token"] = phase(before)

            before = snapshot()
            h.delete_token_secret()
            await until(lambda: h.tokens_issued() == before[0] + 1, 30, "new token", tail())
            await asyncio.sleep(timing.minimal_sync + 2)  # room for a wrong reaction
            await until(lambda: h.state() == "Synchronized", timing.synced_within, "still", tail())
            run.phases["secret deleted"] = phase(before)

        for where in SECRETS:
            namespace, name = where.split("/", 1)
            run.secrets[where] = h.secret_keys(namespace, name)
        crt = h.secret_value("kyma-system", "cluster-client-certificates", "crt") or b""
        run.crt_is_client_only = crt.count(b"BEGIN CERTIFICATE") == 1
        key = h.secret_value("kyma-system", "cluster-client-certificates", "key") or b""
        loaded = load_pem_private_key(key, password=None)
        run.key_bits = getattr(loaded, "key_size", 0)
        run.secrets["key format"] = ["PKCS#1"] if b"BEGIN RSA PRIVATE KEY" in key else ["other"]
    return run


def check_contract(run: Run) -> None:
    for name, expected in CONTRACT.items():
        got = run.phases[name]
        assert got.tokens == expected.tokens, (name, got)
        assert got.connector == expected.connector, (name, got)
        if name == "secret deleted":
            assert got.states[-1] == "Synchronized", (name, got)
            assert set(got.states) <= {"Synchronized", "SynchronizationFailed"}, (name, got)
            continue
        assert got.states == expected.states, (name, got)
        assert got.secured_ops == expected.secured_ops, (name, got)
        assert got.labels_set == expected.labels_set, (name, got)
    for where, keys in SECRETS.items():
        assert run.secrets[where] == keys, (where, run.secrets)
    assert run.secrets["key format"] == ["PKCS#1"]
    assert run.crt_is_client_only
    assert run.key_bits == 4096
    assert run.management_info == {"connectorUrl": True, "directorUrl": True}


class SimProcess:
    """`python -m devenv.runtime_agent_sim` as the real agent runs: its own ServiceAccount and
    RBAC (`runtime_agent.install`), the module's Secrets."""

    def __init__(self, cluster: TestCluster, workdir: Path, timing: Timing) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = workdir / "sim.kubeconfig"
        kubeconfig.write_text(runtime_agent.install(cluster))
        self.log_path = workdir / "runtime-agent-sim.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devenv.runtime_agent_sim",
                "--kubeconfig",
                str(kubeconfig),
                "--sync-period",
                str(timing.sync_period),
                "--minimal-sync",
                str(timing.minimal_sync),
                "--ca-secret",
                runtime_agent.CA_SECRET,
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self._log.close()


@pytest.fixture
def sim_run(own_cluster: TestCluster, tmp_path: Path) -> Iterator[Callable[[], SimProcess]]:
    started: list[SimProcess] = []

    def start() -> SimProcess:
        started.append(SimProcess(own_cluster, tmp_path / "sim", SIM))
        return started[-1]

    yield start
    for process in started:
        process.stop()


async def test_the_stand_in_keeps_the_contract(
    own_cluster: TestCluster, tmp_path: Path, sim_run: Callable[[], SimProcess]
) -> None:
    run = await run_scenario(own_cluster, tmp_path, SIM, sim_run)
    print(run)
    check_contract(run)


async def test_the_real_agent_keeps_the_same_contract(
    own_cluster: TestCluster, tmp_path: Path, runtime_agent_dir: Path
) -> None:
    real = runtime_agent.RealRuntimeAgent(
        own_cluster,
        runtime_agent_dir,
        tmp_path / "runtime-agent",
        sync_period=REAL.sync_period,
        minimal_sync=REAL.minimal_sync,
    )

    def start() -> runtime_agent.RealRuntimeAgent:
        try:
            return real.start()
        except runtime_agent.RuntimeAgentUnavailable as exc:
            pytest.skip(f"the real compass-runtime-agent cannot run here: {exc.reason}")

    try:
        run = await run_scenario(own_cluster, tmp_path, REAL, start)
    finally:
        real.stop()
    print(run)
    check_contract(run)
