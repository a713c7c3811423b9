"""Issue 28, item 1, measured against the broker process as the README starts it (tokenreview
mode, real API servers, the Compass simulator): 48 attackers send well-formed forged tokens for
one runtime whose API server accepts connections and never answers, and a flood of forged
tokens for random runtime IDs arrives at 277 requests a second. First contacts of 20 runtimes
during the stall, and 20 more once the stalled server is remembered, must all get their token
(before: 16 of 20 got 503 `first-contacts-busy` with Retry-After ~175 s); measured on an idle
machine, within a second.

The figures are printed (`-s`) and recorded in docs/overload.md ("What a stranger can cost")."""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime

ATTACKERS = 48
FLOOD_PER_SECOND = 277
FLOOD_BACKLOG = 4 * 64  # requests of the flood in the client at once (64 connections)
LEGIT = 20
AGENT = "system:serviceaccount:kyma-system:compass-agent"


class Silent:
    """A TCP listener that accepts connections and never says a word (a stalled API server)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self._sock.settimeout(0.2)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def forged(runtime_id: str) -> str:
    """A ServiceAccount token that passes every check made without the cluster: only the
    runtime's API server could refuse it."""
    key = ec.generate_private_key(ec.SECP256R1())
    payload = {
        "iss": "https://kubernetes.default.svc",
        "aud": ["compass-broker"],
        "exp": int(time.time()) + 3600,
        "sub": AGENT,
        "jti": runtime_id + uuid.uuid4().hex,
    }
    return jwt.encode(payload, key, algorithm="ES256", headers={"kid": "forged"})


def stalled_runtime(
    control_plane: TestCluster, kcp_ns: str, runtime: TestCluster, port: int
) -> Runtime:
    rt = seed_runtime(control_plane, kcp_ns, runtime)
    config = yaml.safe_load(runtime.kubeconfig_text)
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    name = f"kubeconfig-{rt.runtime_id.lower()}"
    control_plane.core.patch_namespaced_secret(
        name,
        kcp_ns,
        {"data": {"config": base64.b64encode(yaml.safe_dump(config).encode()).decode()}},
    )
    return rt


async def _attack(url: str, runtime_id: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    tokens = [forged(runtime_id) for _ in range(8)]
    async with httpx.AsyncClient(timeout=30) as client:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                r = await client.post(
                    f"{url}/v1/runtimes/{runtime_id}/token",
                    headers={"Authorization": f"Bearer {tokens[i % len(tokens)]}"},
                )
                counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
            except httpx.HTTPError:
                counts["error"] = counts.get("error", 0) + 1
                await asyncio.sleep(0.05)


async def _flood(url: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    token = forged("flood")
    pending: set[asyncio.Task[Any]] = set()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one() -> None:
            try:
                r = await client.post(
                    f"{url}/v1/runtimes/{uuid.uuid4()}/token",
                    headers={"Authorization": f"Bearer {token}"},
                )
                counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
            except httpx.HTTPError:
                counts["error"] = counts.get("error", 0) + 1

        started = time.monotonic()
        sent = 0
        while not stop.is_set():
            due = int((time.monotonic() - started) * FLOOD_PER_SECOND)
            # Requests beyond what the client's connections carry only queue in the client: on
            # a machine too busy to keep the rate, an unbounded queue makes the client's own
            # pool spin (quadratic in its queue) and the test never ends. Those not sent are
            # not counted, so such a machine fails the rate check below instead.
            room = max(0, FLOOD_BACKLOG - len(pending))
            for _ in range(min(due - sent, room)):
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
            sent += min(max(0, due - sent), room)
            await asyncio.sleep(0.01)
        await asyncio.gather(*pending, return_exceptions=True)
    counts["sent"] = sent


async def _first_contacts(
    url: str, runtimes: list[Runtime], tokens: list[str]
) -> list[tuple[int, float]]:
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(rt: Runtime, token: str) -> tuple[int, float]:
            started = time.monotonic()
            r = await client.post(
                f"{url}/v1/runtimes/{rt.runtime_id}/token",
                headers={"Authorization": f"Bearer {token}"},
            )
            return r.status_code, time.monotonic() - started

        return await asyncio.gather(*(one(rt, t) for rt, t in zip(runtimes, tokens, strict=True)))


def test_a_stalled_runtime_and_a_flood_of_forgeries_do_not_crowd_out_first_contacts(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    silent: Silent,
) -> None:
    stalled = stalled_runtime(control_plane, kcp_ns, runtime_a, silent.port)
    waves = [
        [seed_runtime(control_plane, kcp_ns, runtime_a) for _ in range(LEGIT)] for _ in range(2)
    ]
    tokens = [[rt.token() for rt in wave] for wave in waves]
    broker = brokers()

    async def run() -> tuple[list[list[tuple[int, float]]], dict[str, int], dict[str, int]]:
        stop = asyncio.Event()
        attack: dict[str, int] = {}
        flood: dict[str, int] = {}
        tasks = [
            asyncio.create_task(_attack(broker.url, stalled.runtime_id, stop, attack))
            for _ in range(ATTACKERS)
        ]
        tasks.append(asyncio.create_task(_flood(broker.url, stop, flood)))
        await asyncio.sleep(2)  # the stalled server holds the attackers' first checks
        during = await _first_contacts(broker.url, waves[0], tokens[0])
        await asyncio.sleep(12)  # past the runtime API timeout: the stall is remembered
        after = await _first_contacts(broker.url, waves[1], tokens[1])
        stop.set()
        await asyncio.gather(*tasks)
        return [during, after], attack, flood

    results, attack, flood = asyncio.run(run())
    for name, wave in zip(("during the stall", "after the stall"), results, strict=True):
        seconds = sorted(s for _, s in wave)
        print(
            f"\n{name}: {[c for c, _ in wave].count(201)}/{LEGIT} got 201, "
            f"p50 {seconds[len(seconds) // 2]:.3f} s, max (p99) {seconds[-1]:.3f} s"
        )
    print(f"attackers: {attack}; flood: {flood}")
    for wave in results:
        assert [code for code, _ in wave] == [201] * LEGIT, wave
        # Served, not sent away: well inside the agent's 30 s timeout even on a loaded machine.
        # The figure of record (p99 0.85 s on an idle machine) is a measurement, printed above
        # and kept in docs/overload.md, not a bound a busy CI machine must beat.
        assert max(seconds for _, seconds in wave) < 10.0, wave
    # The flood ran at the rate asked, give or take a loaded machine's scheduling.
    assert flood["sent"] >= FLOOD_PER_SECOND * 10 * 0.5
    # The forged tokens for random IDs were refused as unproven, none crowded the limit out.
    assert set(flood) <= {"401", "sent"}, flood
