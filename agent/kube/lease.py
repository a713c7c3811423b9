"""A coordination.k8s.io/v1 Lease that makes one agent replica the active one.

Always holds: an instance acts only while `leading` is set; it takes over a lease only after
the lease stayed unchanged for its whole duration *as observed on our own clock* (no trust in
the other holder's clock); on clean shutdown it hands the lease back so a successor starts at
once. Optimistic concurrency (resourceVersion) decides races between candidates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from agent.kube import resources
from agent.kube.api import JSON, Conflict, KubeClient, KubeError

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # monotonic seconds
Sleep = Callable[[float], Awaitable[None]]


def _micro_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseKeeper:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        renew_every: float,
        monotonic: Clock,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.leading = asyncio.Event()
        self.standby = asyncio.Event()  # always the inverse of `leading`
        self.standby.set()
        self._client = client
        self._path = f"{resources.leases(namespace)}/{name}"
        self._collection = resources.leases(namespace)
        self._namespace = namespace
        self._name = name
        self._identity = identity
        self._duration = duration
        self._renew_every = renew_every
        self._monotonic = monotonic
        self._sleep = sleep
        self._observed: tuple[object, object] | None = None
        self._observed_at = 0.0
        self._last_renewed = 0.0

    def _spec(self, previous: JSON | None) -> JSON:
        now = _micro_time(datetime.now(UTC))
        spec = dict((previous or {}).get("spec") or {})
        taking_over = spec.get("holderIdentity") != self._identity
        spec.update(
            holderIdentity=self._identity,
            leaseDurationSeconds=max(1, round(self._duration)),
            renewTime=now,
        )
        if taking_over:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if previous else 0
            )
        return spec

    async def try_acquire_or_renew(self) -> bool:
        now = self._monotonic()
        stored = await self._client.get(self._path)
        if stored is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(None),
            }
            try:
                await self._client.create(self._collection, body)
            except Conflict:
                return False
            return True
        spec = stored.get("spec") or {}
        holder = spec.get("holderIdentity")
        seen = (holder, spec.get("renewTime"))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        expired = not holder or now - self._observed_at >= duration
        if holder != self._identity and not expired:
            return False
        try:
            await self._client.replace(self._path, {**stored, "spec": self._spec(stored)})
        except Conflict:
            return False
        return True

    async def run(self) -> None:
        while True:
            try:
                ours = await self.try_acquire_or_renew()
            except KubeError as e:
                log.warning("lease not renewed", extra={"error": str(e)})
                ours = False
            now = self._monotonic()
            if ours:
                self._last_renewed = now
                if not self.leading.is_set():
                    log.info("leading", extra={"lease": self._name, "identity": self._identity})
                self.leading.set()
                self.standby.clear()
            elif self.leading.is_set() and now - self._last_renewed >= self._duration:
                # Past our own lease duration without a renewal: someone else may lead now.
                log.warning("lost the lease", extra={"lease": self._name})
                self.leading.clear()
                self.standby.set()
            await self._sleep(self._renew_every)

    async def release(self) -> None:
        """Hands the lease back (holder cleared, 1 s duration) if we hold it."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        self.standby.set()
        try:
            stored = await self._client.get(self._path)
            if stored is None or (stored.get("spec") or {}).get("holderIdentity") != self._identity:
                return
            spec = {**stored["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            await self._client.replace(self._path, {**stored, "spec": spec})
        except KubeError as e:
            log.warning("lease not released", extra={"error": str(e)})
