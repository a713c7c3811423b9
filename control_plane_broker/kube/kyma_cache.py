"""A watch-backed cache of the Kyma CRs in the KCP namespace.

The request path reads only this cache (no API call per request). Holds: `synced` becomes true
after the first complete list and stays true while the watch resumes; after a 410 or a broken
stream the cache re-lists and replaces its content, so deletions missed meanwhile are seen.
Listeners get the names of changed Kymas (a name only: consumers re-read the world).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from control_plane_broker.kube.client import Gone, KubeClient, KubeError
from control_plane_broker.model import KYMA_GROUP, KYMA_VERSION, KymaView

log = logging.getLogger(__name__)

Listener = Callable[[str], None]


class KymaCache:
    def __init__(self, client: KubeClient, *, namespace: str, retry_seconds: float = 1.0) -> None:
        self._client = client
        self._path = f"/apis/{KYMA_GROUP}/{KYMA_VERSION}/namespaces/{namespace}/kymas"
        self._items: dict[str, KymaView] = {}
        self._synced = asyncio.Event()
        self._listeners: list[Listener] = []
        self._retry = retry_seconds

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._synced.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def get(self, name: str) -> KymaView | None:
        return self._items.get(name)

    def names(self) -> list[str]:
        return list(self._items)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _notify(self, name: str) -> None:
        for listener in self._listeners:
            listener(name)

    async def _relist(self) -> str:
        listing = await self._client.get(self._path)
        fresh = {}
        for obj in listing.get("items") or []:
            view = KymaView.from_object(obj)
            fresh[view.name] = view
        changed = set(self._items) ^ set(fresh)
        changed |= {n for n in fresh if n in self._items and self._items[n] != fresh[n]}
        self._items = fresh
        self._synced.set()
        for name in sorted(changed):
            self._notify(name)
        return str((listing.get("metadata") or {}).get("resourceVersion", "0"))

    async def run(self) -> None:
        """List, then watch forever; re-list on 410 or any stream failure."""
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._relist()
                events = 0
                async for event in self._client.watch(
                    self._path, resource_version=resource_version
                ):
                    events += 1
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        resource_version = str(rv)
                    kind = event.get("type")
                    if kind == "BOOKMARK":
                        continue
                    view = KymaView.from_object(obj)
                    if kind == "DELETED":
                        self._items.pop(view.name, None)
                    else:
                        self._items[view.name] = view
                    self._notify(view.name)
                if events == 0:
                    # A stream that ends at once (a proxy cutting it) must not become a busy loop.
                    await asyncio.sleep(self._retry)
            except Gone:
                log.info("kyma watch expired, re-listing")
                resource_version = None
            except KubeError as exc:
                log.warning("kyma watch failed, re-listing", extra={"error": str(exc)})
                resource_version = None
                await asyncio.sleep(self._retry)
