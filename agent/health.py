"""`/healthz`, `/readyz` and `/metrics` on a tiny asyncio HTTP/1.1 server.

Always holds: each request gets one response and the connection closes; the server never
blocks the reconcile loop and stops when its task is cancelled. A full web framework would
add nothing for three GET endpoints that only probes and Prometheus call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Check = Callable[[], bool]
ReadyCheck = Callable[[], tuple[bool, str]]  # ready, and why (the body of /readyz)


class HealthServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Check,
        ready: ReadyCheck,
    ) -> None:
        self._host = host
        self._port = port
        self._registry = registry
        self._healthy = healthy
        self._ready = ready
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            ok = self._healthy()
            return (200, "text/plain", b"ok\n") if ok else (500, "text/plain", b"unhealthy\n")
        if path == "/readyz":
            ok, why = self._ready()
            body = f"{'ready' if ok else 'not ready'}: {why}\n".encode()
            return (200 if ok else 503), "text/plain; charset=utf-8", body
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=10)
            while (await asyncio.wait_for(reader.readline(), timeout=10)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"method not allowed\n"
            else:
                status, ctype, body = self._answer(parts[1].split("?", 1)[0])
            phrase = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Error"}.get(
                status, "Service Unavailable"
            )
            head = (
                f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if parts and parts[0] == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
