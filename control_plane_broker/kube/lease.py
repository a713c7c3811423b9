"""Leader election with a coordination.k8s.io/v1 Lease (the client-go protocol, simplified).

Holds: a replica considers itself leader only while its own renewTime is younger than the lease
duration; taking over an expired lease and renewing are updates with the observed
resourceVersion, so two replicas cannot both succeed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from control_plane_broker.kube.client import Conflict, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def lease_free(spec: dict[str, Any], *, me: str, now: float) -> bool:
    """Pure: may `me` hold this lease now?"""
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    renewed = _parse(spec.get("renewTime") or spec.get("acquireTime"))
    return renewed + float(spec.get("leaseDurationSeconds") or 15) < now


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        me: str,
        duration: float,
        renew_every: float,
        clock: Callable[[], float],
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._client = client
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name
        self._namespace = namespace
        self._me = me
        self._duration = duration
        self._renew = renew_every
        self._clock = clock
        self._on_change = on_change
        self._leading_until = 0.0

    @property
    def leading(self) -> bool:
        return self._clock() < self._leading_until

    async def try_acquire(self) -> bool:
        now = self._clock()
        spec = {
            "holderIdentity": self._me,
            "leaseDurationSeconds": max(1, int(self._duration)),
            "renewTime": _micro(now),
        }
        try:
            current = await self._client.get(f"{self._path}/{self._name}")
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
            }
            try:
                await self._client.create(self._path, body)
            except Conflict:
                return False
            self._leading_until = now + self._duration
            return True
        old = current.get("spec") or {}
        if not lease_free(old, me=self._me, now=now):
            return False
        new_spec = {**old, **spec}
        if old.get("holderIdentity") != self._me:
            new_spec["acquireTime"] = _micro(now)
            new_spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        current["spec"] = new_spec
        try:
            await self._client.replace(f"{self._path}/{self._name}", current)
        except Conflict:
            return False
        self._leading_until = now + self._duration
        return True

    async def run(self) -> None:
        was = False
        while True:
            try:
                await self.try_acquire()
            except KubeError as exc:
                log.warning("lease renewal failed", extra={"error": str(exc)})
            now_leading = self.leading
            if now_leading != was:
                log.info("leadership changed", extra={"leader": now_leading, "identity": self._me})
                if self._on_change is not None:
                    self._on_change(now_leading)
                was = now_leading
            await asyncio.sleep(self._renew)

    async def release(self) -> None:
        """On clean shutdown: hand the lease over at once instead of letting it expire."""
        if not self.leading:
            return
        try:
            current = await self._client.get(f"{self._path}/{self._name}")
            if (current.get("spec") or {}).get("holderIdentity") == self._me:
                current["spec"]["holderIdentity"] = None
                await self._client.replace(f"{self._path}/{self._name}", current)
        except KubeError:
            pass
        self._leading_until = 0.0
