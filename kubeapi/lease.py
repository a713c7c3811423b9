"""Leader election on a coordination.k8s.io/v1 Lease, judged as client-go judges it.

Always holds:
- Another holder's lease counts as expired only when the Lease (holder, renewTime and
  resourceVersion) stayed unchanged for its whole `leaseDurationSeconds` *as observed on our
  own monotonic clock*. A foreign `renewTime` is never compared with our wall clock, so clock
  skew between replicas (or a renewTime in the far past or future) cannot split leadership.
- Acquiring and renewing are updates carrying the observed resourceVersion (create when there
  is no Lease): of two candidates racing, one gets a Conflict and stays a follower.
- We lead from a successful write until `duration` after the moment that attempt *began*
  (the others start counting after they saw the write, so later), unless a renewal succeeds
  first; an attempt made while leading is cut off when that time runs out; seeing another
  holder ends our leadership at once. `leading` is true only inside that window.
- `decided` turns true with the first attempt the API server answered: before it, not leading
  says nothing about another holder;
- `on_change(leading)` is called from `run()` on every flip; `release()` (on a clean stop)
  hands the Lease back with the holder cleared so a successor takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeapi.client import JSON, KubeClient
from kubeapi.kube_errors import Conflict, KubeError

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # monotonic seconds
WallClock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]


def micro_time(now: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class LeaseRecord:
    """What a stored Lease says, read tolerantly: anything malformed counts as absent."""

    holder: str | None
    duration: float | None
    renew_time: str | None
    transitions: int
    resource_version: str

    @classmethod
    def from_object(cls, obj: JSON) -> LeaseRecord:
        spec = obj.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        holder = spec.get("holderIdentity")
        duration = spec.get("leaseDurationSeconds")
        renew = spec.get("renewTime")
        transitions = spec.get("leaseTransitions")
        version = metadata.get("resourceVersion")
        return cls(
            holder=holder if isinstance(holder, str) and holder else None,
            duration=float(duration)
            if isinstance(duration, int) and not isinstance(duration, bool) and duration > 0
            else None,
            renew_time=renew if isinstance(renew, str) else None,
            transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
            resource_version=version if isinstance(version, str) else "",
        )

    @property
    def seen(self) -> tuple[str | None, str | None, str]:
        """What must change for us to count the holder as alive."""
        return (self.holder, self.renew_time, self.resource_version)


def held_by_other(
    record: LeaseRecord, *, me: str, observed_at: float, now: float, default_duration: float
) -> bool:
    """Pure: does someone else hold the lease now, judged by our own observation time?"""
    if record.holder is None or record.holder == me:
        return False
    duration = record.duration if record.duration is not None else default_duration
    return now - observed_at < duration


def lease_spec(previous: JSON | None, *, me: str, duration: float, now: datetime) -> dict[str, Any]:
    """The spec we write to hold the lease; other fields of `previous` are kept."""
    spec = dict(previous or {})
    stamp = micro_time(now)
    record = LeaseRecord.from_object({"spec": spec})
    if record.holder != me:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = record.transitions + (1 if previous is not None else 0)
    spec.update(holderIdentity=me, leaseDurationSeconds=max(1, round(duration)), renewTime=stamp)
    return spec


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        renew_every: float,
        on_change: Callable[[bool], None] | None = None,
        clock: Clock = time.monotonic,
        wall_clock: WallClock = _utcnow,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not 0 < renew_every < duration:
            raise ValueError("renew_every must be positive and shorter than duration")
        self.identity = identity
        self._client = client
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._path = f"{self._collection}/{name}"
        self._namespace = namespace
        self._name = name
        self._duration = duration
        self._renew_every = renew_every
        self._on_change = on_change
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._observed: tuple[str | None, str | None, str] | None = None
        self._observed_at = 0.0
        self._leading_until: float | None = None
        self._reported = False
        self.decided = False

    @property
    def leading(self) -> bool:
        return self._leading_until is not None and self._clock() < self._leading_until

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the lease after it."""
        began = self._clock()
        stored = await self._client.get_or_none(self._path)
        if stored is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": lease_spec(
                    None, me=self.identity, duration=self._duration, now=self._wall_clock()
                ),
            }
            try:
                await self._client.create(self._collection, body)
            except Conflict:
                return False
            self._leading_until = began + self._duration
            return True
        record = LeaseRecord.from_object(stored)
        now = self._clock()
        if record.seen != self._observed:
            self._observed, self._observed_at = record.seen, now
        if held_by_other(
            record,
            me=self.identity,
            observed_at=self._observed_at,
            now=now,
            default_duration=self._duration,
        ):
            self._leading_until = None  # someone else holds it: we do not, whatever we thought
            return False
        spec = stored.get("spec")
        body = {
            **stored,
            "spec": lease_spec(
                spec if isinstance(spec, dict) else {},
                me=self.identity,
                duration=self._duration,
                now=self._wall_clock(),
            ),
        }
        try:
            await self._client.replace(self._path, body)  # carries the observed resourceVersion
        except Conflict:
            return False
        self._leading_until = began + self._duration
        return True

    async def _attempt(self) -> None:
        if not self.leading or self._leading_until is None:
            await self.try_acquire_or_renew()
            return
        # While leading, an attempt that hangs must not outlast our right to lead.
        left = self._leading_until - self._clock()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                await self.try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease renewal timed out", extra={"lease": self._name})

    def _report(self) -> None:
        leading = self.leading
        if leading == self._reported:
            return
        self._reported = leading
        log.info(
            "leading" if leading else "not leading",
            extra={"lease": self._name, "identity": self.identity},
        )
        if self._on_change is not None:
            self._on_change(leading)

    async def run(self) -> None:
        """Acquires and renews until cancelled; `release()` afterwards hands the lease back."""
        while True:
            try:
                await self._attempt()
                self.decided = True
            except KubeError as exc:
                log.warning("lease not renewed", extra={"lease": self._name, "error": str(exc)})
            self._report()
            wait = self._renew_every
            if self.leading and self._leading_until is not None:
                # Wake up in time to notice the end of our leadership if renewals keep failing.
                wait = min(wait, max(self._leading_until - self._clock(), 0.0))
            await self._sleep(wait)

    async def release(self) -> None:
        """Hands the lease back (holder cleared, 1 s duration) if we hold it; best effort."""
        held = self._leading_until is not None
        self._leading_until = None
        self._report()
        if not held:
            return
        try:
            stored = await self._client.get_or_none(self._path)
            if stored is None or LeaseRecord.from_object(stored).holder != self.identity:
                return
            spec = stored.get("spec")
            spec = dict(spec) if isinstance(spec, dict) else {}
            spec.update(
                holderIdentity=None,
                leaseDurationSeconds=1,
                renewTime=micro_time(self._wall_clock()),
            )
            await self._client.replace(self._path, {**stored, "spec": spec})
        except KubeError as exc:
            log.warning("lease not released", extra={"lease": self._name, "error": str(exc)})
