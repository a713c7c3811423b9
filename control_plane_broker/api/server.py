"""The HTTP server: uvicorn on httptools (and uvloop where installed), with the timeouts a
service facing thousands of clients needs.

uvicorn closes idle keep-alive connections, but a connection that sends its request slowly (or
never) would stay open forever and hold a file descriptor and memory: a few hundred such
connections starve a replica. `HeaderTimeoutProtocol` closes a connection whose request (headers
and body) is not complete `header_timeout` seconds after its first byte (or after it opened).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Agents ask rarely; an idle connection is worth keeping only for a retry that follows soon.
KEEP_ALIVE_SECONDS = 15


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_message_complete(self) -> None:
        # The whole request, body included: the broker may answer before reading a body, and
        # a body dribbled in afterwards would otherwise keep resetting the keep-alive timer.
        self._cancel_header_timer()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_with(header_timeout: float) -> type[HeaderTimeoutProtocol]:
    return type("BrokerHttpProtocol", (HeaderTimeoutProtocol,), {"header_timeout": header_timeout})


class Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: the composition root owns the shutdown order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def build_server(app: Any, *, header_timeout: float) -> Server:
    config = uvicorn.Config(
        app,
        http=protocol_with(header_timeout),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        server_header=False,
    )
    return Server(config)


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
