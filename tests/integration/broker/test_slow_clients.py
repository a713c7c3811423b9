"""Slow and idle clients against a real broker process: they cannot hold its connections.

400 connections that send their request slowly (nothing at all, a request line a byte at a time,
or a request line and then headers a byte at a time, never finishing) are all closed by the
broker about `HEADER_TIMEOUT_SECONDS` after they opened, while a normal token request made during
the attack is answered at once; an idle keep-alive connection is closed `KEEP_ALIVE_SECONDS`
after its last answer (not uvicorn's default of 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from control_plane_broker.api.server import KEEP_ALIVE_SECONDS
from control_plane_broker.wiring import HEADER_TIMEOUT_SECONDS
from devenv.clusters import TestCluster
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime
from tests.integration.waiting import eventually

ATTACKERS = 400
MARGIN = 4.0  # seconds a busy 2-core machine may add to a server-side timer
DRIBBLE_EVERY = 0.5  # seconds between two bytes of a slow client


@pytest.fixture
def open_files_for_the_attack() -> Iterator[None]:
    """Room for the attack's sockets, in this process and the broker it starts (inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ATTACKERS * 2 + 512
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def rt(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


@dataclass
class SlowClient:
    """One attacking connection; `closed_after` is when the server closed it (s after open)."""

    style: str
    opened: float = 0.0
    closed_after: float | None = None


async def attack(client: SlowClient, port: int, runtime_id: str, give_up: float) -> None:
    """Opens a connection and sends its request as slowly as its style says, until the server
    closes it or `give_up` seconds have passed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client.opened = time.monotonic()
    request_line = f"POST /v1/runtimes/{runtime_id}/token HTTP/1.1\r\n".encode()
    if client.style == "headers":
        writer.write(request_line + b"Host: broker\r\n")
        trickle = b"X-Slow: " + b"a" * 1000
    elif client.style == "request-line":
        trickle = request_line
    else:
        trickle = b""

    async def dribble() -> None:
        for byte in trickle:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(DRIBBLE_EVERY)
        await asyncio.Event().wait()  # a silent client: just holds the connection

    sender = asyncio.create_task(dribble())
    try:
        # The server never answers a request it has not received: the first read ends at EOF
        # (or a reset) when the server closes the connection.
        with contextlib.suppress(ConnectionError):
            data = await asyncio.wait_for(reader.read(1), give_up)
            assert data == b"", f"{client.style}: the server answered {data!r}"
        client.closed_after = time.monotonic() - client.opened
    except TimeoutError:
        pass  # still open: the assertion below reports it
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.usefixtures("open_files_for_the_attack")
@pytest.mark.timeout(120)
async def test_slow_clients_are_closed_and_a_real_request_is_answered_meanwhile(
    brokers: BrokerFactory, rt: Runtime
) -> None:
    broker = brokers()
    token = rt.token()
    styles = ("silent", "request-line", "headers")
    clients = [SlowClient(styles[i % len(styles)]) for i in range(ATTACKERS)]
    give_up = HEADER_TIMEOUT_SECONDS + MARGIN
    tasks = [asyncio.create_task(attack(c, broker.port, rt.runtime_id, give_up)) for c in clients]
    http = httpx.AsyncClient(base_url=broker.url, timeout=10.0, trust_env=False)
    try:
        await eventually(
            lambda: all(c.opened for c in clients), within=10, what="the attack's connections"
        )
        # During the attack, with all 400 connections held open, a real agent is served.
        started = time.monotonic()
        response = await http.post(
            f"/v1/runtimes/{rt.runtime_id}/token", headers={"Authorization": f"Bearer {token}"}
        )
        took = time.monotonic() - started
        assert response.status_code == 201, response.text
        still_open = sum(c.closed_after is None for c in clients)
        assert still_open == ATTACKERS, "the request was not made during the attack"
        assert took < 5.0, f"the token request took {took:.1f} s during the attack"

        await asyncio.gather(*tasks)
        assert (await http.get("/healthz")).status_code == 200
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.aclose()

    kept_open = [c.style for c in clients if c.closed_after is None]
    assert not kept_open, f"{len(kept_open)} slow connections outlived {give_up} s: {kept_open[:5]}"
    by_style = {
        style: sorted(c.closed_after or 0.0 for c in clients if c.style == style)
        for style in styles
    }
    for style, times in by_style.items():
        # Closed by the header timer: not before it ran out, and not long after.
        assert times[0] >= HEADER_TIMEOUT_SECONDS - 0.5, (style, times[0])
        assert times[-1] <= HEADER_TIMEOUT_SECONDS + MARGIN, (style, times[-1])
    assert broker.running()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, await reader.readexactly(length)


@pytest.mark.timeout(60)
async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(
    brokers: BrokerFactory,
) -> None:
    broker = brokers()
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: broker\r\nConnection: keep-alive\r\n\r\n")
        await writer.drain()
        status, _ = await asyncio.wait_for(read_response(reader), 5)
        answered = time.monotonic()
        assert status == 200
        # Kept alive for a second request right after the first ...
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: broker\r\n\r\n")
        await writer.drain()
        status, _ = await asyncio.wait_for(read_response(reader), 5)
        answered = time.monotonic()
        assert status == 200
        # ... and closed by the server once idle for the keep-alive timeout.
        with contextlib.suppress(ConnectionError):
            data = await asyncio.wait_for(reader.read(1), KEEP_ALIVE_SECONDS + MARGIN)
            assert data == b""
        idle = time.monotonic() - answered
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert KEEP_ALIVE_SECONDS - 0.5 <= idle <= KEEP_ALIVE_SECONDS + MARGIN, idle


@pytest.mark.timeout(60)
async def test_a_slowly_sent_request_body_does_not_hold_the_connection(
    brokers: BrokerFactory,
) -> None:
    """Complete headers, then a body announced large and sent a byte at a time: the broker's
    answer does not wait for the body, but the connection must not stay open for as long as
    the client keeps dribbling (each byte would restart uvicorn's keep-alive timer), or 400
    such clients hold 400 connections just as slow headers would. The whole request gets the
    header timeout."""
    broker = brokers()
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    opened = time.monotonic()
    writer.write(
        b"POST /v1/runtimes/abc/token HTTP/1.1\r\nHost: broker\r\nContent-Length: 100000\r\n\r\n"
    )

    async def dribble() -> None:
        while True:
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(DRIBBLE_EVERY)

    sender = asyncio.create_task(dribble())
    closed_after: float | None = None
    try:
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(HEADER_TIMEOUT_SECONDS + MARGIN):
                while await reader.read(65536):
                    pass  # the answer (a 401) comes at once; what matters is the close
            closed_after = time.monotonic() - opened
    except TimeoutError:
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert closed_after is not None, (
        f"a connection dribbling its body was still open {HEADER_TIMEOUT_SECONDS + MARGIN} s "
        "after it opened"
    )
