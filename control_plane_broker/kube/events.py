"""Kubernetes Events about a Kyma (registration, token issue, unregistration, failures).

Best effort: an Event that cannot be written is dropped, never fails the caller. Messages are
written by the broker itself and never contain tokens.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from control_plane_broker.kube.client import KubeClient, KubeError
from control_plane_broker.model import KYMA_GROUP, KYMA_VERSION
from control_plane_broker.registration.state import to_rfc3339

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(
        self, client: KubeClient, *, namespace: str, component: str, clock: Callable[[], float]
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._component = component
        self._clock = clock

    async def record(
        self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        now = to_rfc3339(self._clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{kyma_name}.{uuid.uuid4().hex[:16]}",
                "namespace": self._namespace,
            },
            "involvedObject": {
                "apiVersion": f"{KYMA_GROUP}/{KYMA_VERSION}",
                "kind": "Kyma",
                "name": kyma_name,
                "namespace": self._namespace,
                "uid": kyma_uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._client.create(f"/api/v1/namespaces/{self._namespace}/events", body)
        except KubeError as exc:
            log.debug("event dropped", extra={"reason": reason, "error": str(exc)})
