"""`Informer[T]`: list + watch of one collection, kept as a store of parsed objects by name.

A collection path is one namespace's (or a cluster-scoped) collection, so names are unique.
Listeners get the *name* of each object that was added, changed or deleted; they read the
store (or the world) again themselves — a level-based consumer, not an event log.

Always holds:
- `run()` goes on until cancelled, whatever the API server does: a 410 Gone re-lists at once;
  a garbled line, an ERROR event, a cut connection or an API-server error re-lists after
  `delay(failures)`, where `failures` counts since the last successful list (so the n-th
  outage of a long life starts its backoff over); a watch that ends at once waits
  `delay(n)` before the next one, so a proxy that closes every stream cannot make it spin.
- Every (re)list replaces the store and notifies each name whose object appeared, changed or
  disappeared meanwhile — deletions missed while not watching are reported
  (`missed_deletions` counts them).
- One object that `parse` refuses (hostile or malformed) is logged by name and treated as
  absent; it never stops the informer or the other objects.
- With `missing_kind_is_empty`, a 404 on list (the kind's CRD is not installed) counts as an
  empty, synced collection, and the informer keeps looking with the same backoff.
- `last_contact` is the monotonic time of the last successful list, event or bookmark, so a
  caller can tell a quiet collection from a stale one.
- `listed_at` is the wall-clock time the last list's answer arrived: every object that existed
  at any moment since then passed through the store (created, changed or deleted), so a caller
  can tell "never existed" from "existed before we looked".
- `metadata.managedFields` is dropped before `parse` (as client-go's informers may): nobody
  here reads it, it is often the largest part of an object, and an update that omits it leaves
  the server's copy as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

from kubeapi.client import JSON, KubeClient, WatchEvent
from kubeapi.kube_errors import Gone, KubeError, NotFound

log = logging.getLogger(__name__)

T = TypeVar("T")
Listener = Callable[[str], None]
Delay = Callable[[int], float]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


def object_name(obj: JSON) -> str | None:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


def object_version(obj: JSON) -> str:
    metadata = obj.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) else ""


def without_managed_fields(obj: JSON) -> JSON:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or "managedFields" not in metadata:
        return obj
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


def changed_names(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Names (by resourceVersion) that appeared, changed or disappeared between two lists."""
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


class Informer(Generic[T]):
    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str,
        parse: Callable[[JSON], T],
        delay: Delay,
        field_selector: str | None = None,
        label_selector: str | None = None,
        missing_kind_is_empty: bool = False,
        timeout_seconds: int = 300,
        min_watch_seconds: float = 1.0,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.name = name
        self.relists = 0
        self.listed_at: float | None = None
        self.missed_deletions = 0
        self.last_contact: float | None = None
        self._events = 0  # seen over the informer's life: tells a stuck 410 loop from progress
        self._client = client
        self._path = path
        self._parse = parse
        self._delay = delay
        self._field_selector = field_selector
        self._label_selector = label_selector
        self._missing_kind_is_empty = missing_kind_is_empty
        self._timeout_seconds = timeout_seconds
        self._min_watch = min_watch_seconds
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._items: dict[str, T] = {}
        # Every named object seen, parsed or not: what a re-list is compared with.
        self._versions: dict[str, str] = {}
        self._synced = asyncio.Event()
        self._listeners: list[Listener] = []

    # -- reading ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def get(self, name: str) -> T | None:
        return self._items.get(name)

    def values(self) -> list[T]:
        return list(self._items.values())

    def names(self) -> list[str]:
        return list(self._items)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- keeping the store -----------------------------------------------------------------

    def _notify(self, names: Iterable[str]) -> None:
        for name in names:
            for listener in self._listeners:
                try:
                    listener(name)
                except Exception:
                    log.exception("informer listener failed", extra={"informer": self.name})

    def _parsed(self, name: str, obj: JSON) -> T | None:
        try:
            return self._parse(without_managed_fields(obj))
        except Exception as exc:
            # Only the type: a parser's message may quote the hostile values themselves.
            log.warning(
                "object does not parse, treated as absent",
                extra={"informer": self.name, "object": name, "error": type(exc).__name__},
            )
            return None

    def _replace_all(self, objects: list[JSON]) -> None:
        items: dict[str, T] = {}
        versions: dict[str, str] = {}
        for obj in objects:
            name = object_name(obj)
            if name is None:
                log.warning("listed object without a name", extra={"informer": self.name})
                continue
            versions[name] = object_version(obj)
            parsed = self._parsed(name, obj)
            if parsed is not None:
                items[name] = parsed
        missed = self._versions.keys() - versions.keys()
        if missed and self.relists:
            self.missed_deletions += len(missed)
            log.info(
                "deletions seen only on re-list",
                extra={"informer": self.name, "count": len(missed)},
            )
        changed = changed_names(self._versions, versions)
        self._items, self._versions = items, versions
        self._notify(changed)

    def _apply(self, event: WatchEvent) -> None:
        name = object_name(event.object)
        if name is None:
            log.warning("watch event without a name", extra={"informer": self.name})
            return
        if event.type == "DELETED":
            self._items.pop(name, None)
            self._versions.pop(name, None)
        else:
            self._versions[name] = object_version(event.object)
            parsed = self._parsed(name, event.object)
            if parsed is None:
                self._items.pop(name, None)
            else:
                self._items[name] = parsed
        self._notify([name])

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        gone_at_once = 0
        while True:
            events_before = self._events
            try:
                version = await self._relist()
                failures = 0
                await self._watch(version)
            except Gone:
                # Too old a version: re-list at once — unless the server keeps saying so right
                # after each list, which must not become a busy loop either.
                gone_at_once = gone_at_once + 1 if self._events == events_before else 0
                log.info("watch expired, re-listing", extra={"informer": self.name})
                if gone_at_once > 1:
                    await self._sleep(self._delay(gone_at_once - 1))
            except NotFound as exc:
                failures += 1
                if self._missing_kind_is_empty:
                    self._kind_missing()
                else:
                    self._log_failure(exc, failures)
                await self._sleep(self._delay(failures))
            except KubeError as exc:
                failures += 1
                self._log_failure(exc, failures)
                await self._sleep(self._delay(failures))

    def _log_failure(self, exc: KubeError, failures: int) -> None:
        log.warning(
            "list or watch failed, re-listing later",
            extra={"informer": self.name, "error": str(exc), "failures": failures},
        )

    def _kind_missing(self) -> None:
        # Nothing of an uninstalled kind exists: an empty store, known for certain.
        self.last_contact = self._clock()
        self.listed_at = self._wall()
        self._replace_all([])
        if not self._synced.is_set():
            log.info("kind not installed, counted as empty", extra={"informer": self.name})
        self._synced.set()

    async def _relist(self) -> str:
        listing = await self._client.list(
            self._path, field_selector=self._field_selector, label_selector=self._label_selector
        )
        self.last_contact = self._clock()
        self.listed_at = self._wall()
        self._replace_all(listing.items)
        self.relists += 1
        self._synced.set()
        return listing.resource_version

    async def _watch(self, version: str) -> None:
        """Watches from `version` until an error is raised; resumes when the server ends."""
        quick_ends = 0
        while True:
            began = self._clock()
            async for event in self._client.watch(
                self._path,
                resource_version=version,
                field_selector=self._field_selector,
                label_selector=self._label_selector,
                timeout_seconds=self._timeout_seconds,
            ):
                self._events += 1
                self.last_contact = self._clock()
                version = event.resource_version or version
                if event.type != "BOOKMARK":
                    self._apply(event)
            if self._clock() - began < self._min_watch:
                quick_ends += 1
                await self._sleep(self._delay(quick_ends))
            else:
                quick_ends = 0
