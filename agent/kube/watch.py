"""List-then-watch of one kind of object; every change only *notifies* (level-based loop).

Always holds: after every (re)list the watcher notifies, since anything may have changed
while it was not watching; a 410 Gone re-lists at once; other failures (API server down, a
dropped or garbled stream, the CRD not installed yet) re-list after THE retry policy's backoff,
forever, until cancelled. The backoff counts failures since the last successful list only, so
the n-th disconnect in a long life is retried as promptly as the first. Cancelling the task
ends the watch cleanly (httpx closes the stream). A kind that is not installed (404 on list)
counts as synced — empty — and is looked for again with the same backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agent.kube.api import Gone, KubeClient, KubeError
from agent.retry import RandomSource, RetryPolicy, next_delay

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class Watcher:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str,
        notify: Callable[[], None],
        policy: RetryPolicy,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        rng: RandomSource | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.name = name
        self.synced = asyncio.Event()
        self.relists = 0
        self._client = client
        self._path = path
        self._notify = notify
        self._policy = policy
        self._field_selector = field_selector
        self._timeout_seconds = timeout_seconds
        self._rng = rng
        self._sleep = sleep

    async def run(self) -> None:
        failures = 0
        while True:
            listed_before = self.relists
            try:
                await self._list_and_watch()
            except Gone:
                log.info("watch expired, re-listing", extra={"watch": self.name})
                failures = 0
            except KubeError as e:
                # A failure after a successful list starts a new outage, not the old one going on.
                failures = 1 if self.relists > listed_before else failures + 1
                if e.status == 404 and not self.synced.is_set():
                    # The kind is not installed (its CRD comes with a module): there is nothing
                    # to know about it, so it does not hold readiness back; keep looking.
                    self.synced.set()
                    self._notify()
                delay = next_delay(self._policy, failures, rng=self._rng)
                log.warning(
                    "watch failed, re-listing later",
                    extra={"watch": self.name, "error": str(e), "delay": round(delay, 2)},
                )
                await self._sleep(delay)

    async def _list_and_watch(self) -> None:
        listing = await self._client.list(self._path, field_selector=self._field_selector)
        self.relists += 1
        version = str(listing.get("metadata", {}).get("resourceVersion", ""))
        self._notify()
        self.synced.set()
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            async for event in self._client.watch(
                self._path,
                resource_version=version,
                field_selector=self._field_selector,
                timeout_seconds=self._timeout_seconds,
            ):
                obj = event.get("object") or {}
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if event.get("type") != "BOOKMARK":
                    self._notify()
            # The server ended the watch (its timeout): carry on from the last version seen —
            # but not at once if it ended at once, which would otherwise spin.
            if loop.time() - began < 1.0:
                await self._sleep(next_delay(self._policy, 1, rng=self._rng))
