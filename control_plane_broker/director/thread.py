"""Director calls on an event loop of their own, in a thread of their own.

Why: a Director call holds one of Director's C slots from the moment it is sent until its
answer has been read. On the main event loop, with thousands of agent requests, KCP writes and
watch events ready to run, an answer that has arrived waits its turn behind all of them: at
N = 5,000 a 100 ms call held its slot about 157 ms, and Director's capacity went a third unused.
Here the answer is read as soon as the thread gets the interpreter (Python switches threads every
5 ms), the slot is handed to the next call at once, and the main loop's load no longer stretches
the calls.

Holds: everything Director-side (the HTTP clients, OAuth source, guard with its slots and
breaker, the client) is created for and used on the Director loop only; callers on the main loop
await `DirectorInThread` methods, which run the call there and hand back its result or its
exception; cancelling the caller cancels the call. The guard's cheap checks (`refuse_if_open`,
`book`) only read and replace immutable state and are safe to call from the main loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from control_plane_broker.director.client import DirectorClient
from control_plane_broker.director.models import DirectorRuntime, OneTimeToken, RuntimeRegisterInput

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # noqa: PLC0415 (optional speed-up, installed with uvicorn[standard])
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class LoopThread:
    """An event loop running forever in a daemon thread, until `stop`."""

    def __init__(self, name: str) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on this thread's loop; awaitable (and cancellable) from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class DirectorInThread:
    """The `DirectorClient` interface, each call carried out on the Director thread."""

    def __init__(self, client: DirectorClient, thread: LoopThread) -> None:
        self._client = client
        self._thread = thread

    async def _on_thread(self, call: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await call()

        return await self._thread.run(run())

    async def runtimes_by_label(
        self, *, tenant: str, key: str, value: str
    ) -> list[DirectorRuntime]:
        return await self._on_thread(
            lambda: self._client.runtimes_by_label(tenant=tenant, key=key, value=value)
        )

    async def register_runtime(self, *, tenant: str, spec: RuntimeRegisterInput) -> DirectorRuntime:
        return await self._on_thread(
            lambda: self._client.register_runtime(tenant=tenant, spec=spec)
        )

    async def unregister_runtime(self, *, tenant: str, runtime_id: str) -> bool:
        return await self._on_thread(
            lambda: self._client.unregister_runtime(tenant=tenant, runtime_id=runtime_id)
        )

    async def request_one_time_token(
        self, *, tenant: str, runtime_id: str, follow_up: bool = False
    ) -> OneTimeToken:
        return await self._on_thread(
            lambda: self._client.request_one_time_token(
                tenant=tenant, runtime_id=runtime_id, follow_up=follow_up
            )
        )

    async def set_runtime_label(
        self, *, tenant: str, runtime_id: str, key: str, value: Any
    ) -> None:
        await self._on_thread(
            lambda: self._client.set_runtime_label(
                tenant=tenant, runtime_id=runtime_id, key=key, value=value
            )
        )
