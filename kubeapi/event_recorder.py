"""`EventRecorder`: writes Kubernetes Events (core/v1), aggregated as client-go's recorder does.

The same event again — same involved object (by uid, else kind/namespace/name), type, reason
and message — within `window` seconds of its last occurrence does not make a new Event: the
existing one gets `count` + 1 and a new `lastTimestamp` (one merge PATCH), which is what
`kubectl get events` shows as COUNT and LAST SEEN. Which Event stands for which key is kept in
a bounded LRU (`max_keys`); an Event that expired meanwhile (the API server's event TTL) is
created again.

Always holds: `record` never raises into its caller — events are best effort, the log has the
same facts — and logs a warning instead; the message is cut to 1 KiB (UTF-8) and callers never
put a secret in it; a core/v1 Event lives in its object's namespace (an `ObjectRef` without
one is in the recorder's `namespace`); concurrent records of one key write one Event.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubeapi.client import JSON, KubeClient
from kubeapi.kube_errors import NotFound

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1024
EVENT_TYPES = frozenset({"Normal", "Warning"})

WallClock = Callable[[], datetime]


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None


@dataclass
class _Seen:
    event_name: str
    namespace: str
    count: int  # as written on the Event
    last: datetime  # last occurrence
    written: datetime  # last write
    pending: int = 0  # occurrences counted here, not yet written


_Key = tuple[str, str, str, str]


def event_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate_utf8(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """At most `limit` bytes of UTF-8, never splitting a character."""
    return text.encode()[:limit].decode(errors="ignore")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class EventRecorder:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        component: str,
        host: str,
        clock: WallClock = _utcnow,
        window: float = 600.0,
        max_keys: int = 4096,
        min_write_interval: float = 0.0,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._component = component
        self._host = host
        self._clock = clock
        self._window = window
        self._max_keys = max_keys
        # With a positive interval, repeats within it are only counted here and written by the
        # next repeat after it or by `flush`: a busy object costs one write per interval, not
        # one per occurrence (client-go's recorder drops what its spam filter refuses; we keep
        # the count).
        self._min_write_interval = min_write_interval
        self._seen: OrderedDict[_Key, _Seen] = OrderedDict()
        self._locks: dict[_Key, tuple[asyncio.Lock, int]] = {}

    def body(
        self, involved: ObjectRef, *, name: str, type_: str, reason: str, message: str, now: str
    ) -> JSON:
        """A new core/v1 Event (count 1)."""
        namespace = involved.namespace or self._namespace
        ref: dict[str, str] = {
            "apiVersion": involved.api_version,
            "kind": involved.kind,
            "name": involved.name,
            "namespace": namespace,
        }
        if involved.uid:
            ref["uid"] = involved.uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    async def record(self, involved: ObjectRef, *, type_: str, reason: str, message: str) -> None:
        """Writes (or counts) the event; never raises."""
        try:
            if type_ not in EVENT_TYPES:
                raise ValueError(f"event type must be one of {sorted(EVENT_TYPES)}")
            message = truncate_utf8(message)
            subject = involved.uid or f"{involved.kind}/{involved.namespace}/{involved.name}"
            key = (subject, type_, reason, message)
            async with self._lock(key):
                await self._write(key, involved, type_=type_, reason=reason, message=message)
        except Exception as exc:
            log.warning(
                "could not record an event",
                extra={"reason": reason, "error": str(exc) or type(exc).__name__},
            )

    async def _write(
        self, key: _Key, involved: ObjectRef, *, type_: str, reason: str, message: str
    ) -> None:
        now = self._clock()
        stamp = event_time(now)
        seen = self._seen.get(key)
        if seen is not None and (now - seen.last).total_seconds() <= self._window:
            self._seen.move_to_end(key)
            if (now - seen.written).total_seconds() < self._min_write_interval:
                seen.pending += 1
                seen.last = now
                return
            if await self._patch(seen, occurrences=seen.pending + 1, now=now):
                return
        name = f"{involved.name[:200]}.{uuid.uuid4().hex[:16]}"
        body = self.body(
            involved, name=name, type_=type_, reason=reason, message=message, now=stamp
        )
        namespace = body["metadata"]["namespace"]
        await self._client.create(f"/api/v1/namespaces/{namespace}/events", body)
        self._seen[key] = _Seen(
            event_name=name, namespace=namespace, count=1, last=now, written=now
        )
        self._seen.move_to_end(key)
        while len(self._seen) > self._max_keys:
            self._seen.popitem(last=False)

    async def _patch(self, seen: _Seen, *, occurrences: int, now: datetime) -> bool:
        """Adds `occurrences` to the Event; False when it is gone (expired or deleted)."""
        path = f"/api/v1/namespaces/{seen.namespace}/events/{seen.event_name}"
        try:
            await self._client.merge_patch(
                path, {"count": seen.count + occurrences, "lastTimestamp": event_time(now)}
            )
        except NotFound:
            return False
        seen.count += occurrences
        seen.pending = 0
        seen.last = seen.written = now
        return True

    async def flush(self) -> None:
        """Writes the counts held back by `min_write_interval`; never raises."""
        for key, seen in list(self._seen.items()):
            if not seen.pending:
                continue
            try:
                async with self._lock(key):
                    if seen.pending:
                        await self._patch(seen, occurrences=seen.pending, now=seen.last)
            except Exception as exc:
                log.warning("could not flush an event count", extra={"error": type(exc).__name__})

    async def run_flusher(self) -> None:
        """Flushes every `min_write_interval` seconds, forever (run it as a background task)."""
        while True:
            await asyncio.sleep(max(self._min_write_interval, 1.0))
            await self.flush()

    def _lock(self, key: _Key) -> _KeyLock:
        return _KeyLock(self._locks, key)


class _KeyLock:
    """One asyncio.Lock per key, dropped when nobody holds or waits for it."""

    def __init__(self, locks: dict[_Key, tuple[asyncio.Lock, int]], key: _Key) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._key, (asyncio.Lock(), 0))
        self._locks[self._key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting: no longer a user
            self._leave()
            raise

    async def __aexit__(self, *_: object) -> None:
        self._locks[self._key][0].release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self._locks[self._key]
        if users == 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)
