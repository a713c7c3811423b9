"""`CompassSimulator`: the simulator's parts, its listeners and its Python API.

The simulator serves from one background thread with its own asyncio loop and two
uvicorn servers: the main listener (Compass endpoints and `/_sim/`) and an admin
listener (`/_sim/` only). While faults say `down: refuse`, the main listener is
closed, so clients get "connection refused"; it is reopened on the same port when
that fault is cleared. All state sits in thread-safe objects, so the Python API can
be used from any thread; calls that change listeners run on the simulator's loop.

State (runtimes, Connector and access tokens, as hashes) is kept in memory and,
with `state_file`, loaded at construction and saved shortly after changes and on
stop (atomically: temporary file, then rename).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import uvicorn

from .app import build_admin_app, build_main_app
from .ca import CertificateAuthority
from .capacity import CapacityGate, ConcurrencyStats
from .config import SimConfig
from .connector import Connector, ConnectorUrls
from .director import Director
from .faults import DownMode, Faults, FaultState
from .oauth import OAuthServer
from .operations import READ_SCOPE, WRITE_SCOPE
from .recorder import OperationCounter, Outcome, Recorder, RequestRecord
from .store import ConnectorTokenRecord, RuntimeRecord, RuntimeStatusCondition, Store

__all__ = ["CompassSimulator"]

log = logging.getLogger(__name__)

_STATE_FORMAT = "compass-sim-state/1"
_T = TypeVar("_T")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio enables TCP_NODELAY on accepted connections only
    # for sockets that say so, and without it every response waits for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listen right away: connections made before uvicorn runs wait in the backlog.
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class CompassSimulator:
    def __init__(
        self,
        config: SimConfig,
        *,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        access_log: bool = False,
    ) -> None:
        self.config = config
        self.clock: Callable[[], float] = clock or time.time
        self._access_log = access_log
        self.store = Store()
        self.oauth = OAuthServer(
            client_id=config.client_id,
            client_secret=config.client_secret,
            client_scopes=config.client_scopes,
            ttl_seconds=config.access_token_ttl_seconds,
            clock=self.clock,
        )
        self.faults_state = FaultState(
            config.initial_faults, rng=rng or random.Random(), clock=self.clock
        )
        self.recorder = Recorder(log_size=config.request_log_size)
        self.ca = CertificateAuthority(
            clock=self.clock, validity_seconds=config.certificate_validity_seconds
        )
        self.director = Director(
            config=config,
            store=self.store,
            oauth=self.oauth,
            clock=self.clock,
            connector_url=lambda: f"{self.public_url}/connector/graphql",
        )
        self.connector = Connector(
            config=config,
            store=self.store,
            ca=self.ca,
            clock=self.clock,
            urls=lambda: (
                self.certificate_secured
                or ConnectorUrls(
                    director=f"{self.public_url}/director/graphql",
                    certificate_secured_connector=f"{self.public_url}/connector/graphql",
                )
            ),
        )
        # Set by `mtls.CertificateSecuredCompass` while it serves: runtimes then get its URLs.
        self.certificate_secured: ConnectorUrls | None = None
        self.capacity = CapacityGate(config.initial_faults.max_concurrent_director_requests)

        self._host: str | None = None
        self._port: int | None = None
        self._admin_port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._faults_lock: asyncio.Lock | None = None
        self._main: tuple[uvicorn.Server, asyncio.Task[None]] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._save_lock = threading.Lock()
        self._saved_version: tuple[int, int] | None = None
        if config.state_file is not None and config.state_file.exists():
            self._load_state(config.state_file)

    # -- addresses ------------------------------------------------------------------

    def _base(self, port: int | None) -> str:
        if self._host is None or port is None:
            raise RuntimeError("the simulator is not running")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self._base(self._port)

    @property
    def admin_url(self) -> str:
        """Base URL of the admin listener (`/_sim/...`), reachable even while "down"."""
        return self._base(self._admin_port)

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the simulator is not running")
        return self._port

    @property
    def public_url(self) -> str:
        return (self.config.public_url or self.url).rstrip("/")

    @property
    def token_url(self) -> str:
        return f"{self.url}/oauth/token"

    @property
    def director_url(self) -> str:
        return f"{self.url}/director/graphql"

    @property
    def connector_url(self) -> str:
        return f"{self.url}/connector/graphql"

    @property
    def running_now(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def listening(self) -> bool:
        """Whether the main listener accepts connections (False while `down: refuse`)."""
        return self._main is not None

    # -- lifecycle --------------------------------------------------------------------

    def start(
        self, host: str = "127.0.0.1", port: int = 0, *, admin_port: int = 0, timeout: float = 15
    ) -> Self:
        """Serve from a background thread; returns once both listeners accept connections."""
        if self._thread is not None:
            raise RuntimeError("the simulator is already running")
        main_sock = _bind(host, port)
        try:
            admin_sock = _bind(host, admin_port)
        except OSError:
            main_sock.close()
            raise
        self._host = host
        self._port = main_sock.getsockname()[1]
        self._admin_port = admin_sock.getsockname()[1]
        ready = concurrent.futures.Future[None]()
        self._thread = threading.Thread(
            target=self._thread_main,
            args=(main_sock, admin_sock, ready),
            name=f"compass-sim-{self._port}",
            daemon=True,
        )
        self._thread.start()
        try:
            ready.result(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        log.info("compass simulator listening on %s (admin %s)", self.url, self.admin_url)
        return self

    def stop(self, timeout: float = 15) -> None:
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None and not loop.is_closed():
            with suppress(RuntimeError):  # the loop may have just finished
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("the simulator thread did not stop in time")
        self._thread = None
        self._loop = None

    @contextmanager
    def running(
        self, host: str = "127.0.0.1", port: int = 0, *, admin_port: int = 0
    ) -> Iterator[Self]:
        self.start(host, port, admin_port=admin_port)
        try:
            yield self
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _thread_main(
        self,
        main_sock: socket.socket,
        admin_sock: socket.socket,
        ready: concurrent.futures.Future[None],
    ) -> None:
        try:
            asyncio.run(self._serve(main_sock, admin_sock, ready))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.exception("compass simulator stopped with an error")
        finally:
            for sock in (main_sock, admin_sock):
                sock.close()

    def _uvicorn(self, app: Any) -> uvicorn.Server:
        return uvicorn.Server(
            uvicorn.Config(
                app,
                http="h11",
                ws="none",
                lifespan="off",
                log_config=None,
                access_log=self._access_log,
                proxy_headers=False,
                server_header=False,
                timeout_graceful_shutdown=self.config.graceful_shutdown_seconds,
            )
        )

    async def _run_server(self, server: uvicorn.Server, sock: socket.socket) -> asyncio.Task[None]:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the listener stopped during startup")
            await asyncio.sleep(0.005)
        return task

    async def _serve(
        self,
        main_sock: socket.socket,
        admin_sock: socket.socket,
        ready: concurrent.futures.Future[None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._faults_lock = asyncio.Lock()
        # A fresh gate per run: asyncio primitives belong to one loop.
        self.capacity = CapacityGate(self.faults().max_concurrent_director_requests)
        admin = self._uvicorn(build_admin_app(self))
        admin_task = await self._run_server(admin, admin_sock)
        persist: asyncio.Task[None] | None = None
        try:
            if self.faults().down is DownMode.REFUSE:
                main_sock.close()
            else:
                await self._open_main(main_sock)
            if self.config.state_file is not None:
                persist = asyncio.create_task(self._persist_loop())
            ready.set_result(None)
            await self._stop_event.wait()
        finally:
            if persist is not None:
                persist.cancel()
                with suppress(asyncio.CancelledError):
                    await persist
            # Stop both listeners at once: each takes a few of uvicorn's 0.1 s ticks.
            await self._close_main(wait=False)
            admin.should_exit = True
            await asyncio.gather(admin_task, *self._closing)
            self.save_state()

    async def _open_main(self, sock: socket.socket | None = None) -> None:
        if self._main is not None:
            return
        assert self._host is not None
        assert self._port is not None
        server = self._uvicorn(build_main_app(self))
        sock = sock or _bind(self._host, self._port)
        try:
            task = await self._run_server(server, sock)
        except BaseException:
            sock.close()
            raise
        self._main = (server, task)

    async def _close_main(self, *, wait: bool) -> None:
        """Refuse new connections at once; finish open ones in the background unless `wait`."""
        if self._main is None:
            return
        server, task = self._main
        self._main = None
        for listener in server.servers:
            listener.close()
        # Close idle keep-alive connections now, busy ones after their response,
        # so no client is served by the closed listener any more.
        for connection in list(server.server_state.connections):
            connection.shutdown()
        # Transports close on the next loop iterations; let that happen before answering,
        # so a client does not reuse a pooled connection that is about to go away.
        for _ in range(3):
            await asyncio.sleep(0)
        server.should_exit = True
        if wait:
            await task
        else:
            # Not awaited: the request that asked for this may be one of those connections.
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _in_loop(self, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError("the simulator is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking call from the simulator's own thread")
        return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout=30)

    # -- faults -----------------------------------------------------------------------

    def faults(self) -> Faults:
        """The current faults, with counted faults reduced by what already fired."""
        return self.faults_state.get()

    def set_faults(self, faults: Faults) -> Faults:
        if not self.running_now:
            self.faults_state.replace(faults)
            return self.faults()
        return self._in_loop(lambda: self.apply_faults(faults))

    def update_faults(self, **changes: Any) -> Faults:
        """Replace the given top-level fields of the current faults."""
        return self.set_faults(Faults.model_validate({**self.faults().model_dump(), **changes}))

    def clear_faults(self) -> Faults:
        return self.set_faults(Faults())

    async def apply_faults(self, faults: Faults) -> Faults:
        """Switch to `faults`; runs on the simulator's loop (admin API, `set_faults`)."""
        assert self._faults_lock is not None
        async with self._faults_lock:
            self.faults_state.replace(faults)
            await self.capacity.set_limit(faults.max_concurrent_director_requests)
            if faults.down is DownMode.REFUSE:
                await self._close_main(wait=False)
            else:
                await self._open_main()
            log.info("faults set: %s", faults.model_dump_json(exclude_defaults=True))
            return self.faults()

    # -- observations -----------------------------------------------------------------

    def counters(self) -> dict[str, OperationCounter]:
        return self.recorder.counters()

    def counter(self, operation: str) -> OperationCounter:
        """The counter of one operation (all zero if it was never called)."""
        return self.recorder.counters().get(operation, OperationCounter())

    def request_log(
        self,
        *,
        operation: str | None = None,
        tenant: str | None = None,
        outcome: Outcome | None = None,
        since_seq: int = 0,
    ) -> list[RequestRecord]:
        return self.recorder.requests(
            operation=operation, tenant=tenant, outcome=outcome, since_seq=since_seq
        )

    def concurrency(self) -> ConcurrencyStats:
        return self.capacity.stats()

    def runtimes(self, tenant: str | None = None) -> list[RuntimeRecord]:
        return self.store.runtimes(tenant)

    def runtime(self, runtime_id: str) -> RuntimeRecord | None:
        return self.store.find_runtime(runtime_id)

    def connector_tokens(self, runtime_id: str | None = None) -> list[ConnectorTokenRecord]:
        """Metadata of one-time and CSR tokens (hashes only, never the tokens)."""
        return self.store.tokens(runtime_id)

    # -- test helpers -----------------------------------------------------------------

    def seed_runtime(
        self,
        *,
        tenant: str,
        name: str,
        labels: dict[str, Any] | None = None,
        description: str | None = None,
        runtime_id: str | None = None,
        status: RuntimeStatusCondition = RuntimeStatusCondition.INITIAL,
    ) -> RuntimeRecord:
        """Store a runtime as given, without validation, faults or counters."""
        return self.store.create_runtime(
            tenant,
            now=datetime.fromtimestamp(self.clock(), UTC),
            id=runtime_id,
            name=name,
            description=description,
            labels=dict(labels or {}),
            status_condition=status,
        )

    def issue_access_token(self, scopes: tuple[str, ...] = (READ_SCOPE, WRITE_SCOPE)) -> str:
        """A valid bearer token for Director, without going through `/oauth/token`."""
        return self.oauth.issue(self.config.client_id, frozenset(scopes))[0]

    def reset(self, *, state: bool = True, faults: bool = True, counters: bool = True) -> None:
        """Forget runtimes and Connector tokens, faults, counters and the request log.

        Access tokens stay valid, so clients that cached one keep working.
        """
        if not self.running_now:
            self._reset_sync(state=state, faults=faults, counters=counters)
            return
        self._in_loop(lambda: self.reset_async(state=state, faults=faults, counters=counters))

    async def reset_async(self, *, state: bool, faults: bool, counters: bool) -> None:
        if faults:
            await self.apply_faults(Faults())
        self._reset_sync(state=state, faults=False, counters=counters)

    def _reset_sync(self, *, state: bool, faults: bool, counters: bool) -> None:
        if state:
            self.store.clear()
        if faults:
            self.faults_state.replace(Faults())
        if counters:
            self.recorder.clear()
            self.capacity.reset_peaks()

    # -- persistence ------------------------------------------------------------------

    def _state_version(self) -> tuple[int, int]:
        return (self.store.version, self.oauth.version)

    def save_state(self) -> bool:
        """Write the state file now (if configured); returns whether one was written."""
        path = self.config.state_file
        if path is None:
            return False
        with self._save_lock:
            version = self._state_version()
            data = {
                "format": _STATE_FORMAT,
                **self.store.to_storage(),
                "access_tokens": self.oauth.to_storage(),
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "w") as handle:
                    json.dump(data, handle)
                os.replace(tmp, path)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp)
                raise
            self._saved_version = version
        return True

    def _load_state(self, path: Path) -> None:
        data = json.loads(path.read_text())
        if data.get("format") != _STATE_FORMAT:
            raise ValueError(f"{path} is not a compass simulator state file")
        self.store.load_storage(data)
        self.oauth.load_storage(data.get("access_tokens", []))
        self._saved_version = self._state_version()
        log.info("loaded %d runtimes from %s", len(self.store.runtimes()), path)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.state_save_interval_seconds)
            if self._state_version() != self._saved_version:
                await asyncio.to_thread(self.save_state)
