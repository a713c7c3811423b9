"""Events about a Kyma in KCP (registration, token issue, unregistration, failures).

A thin adapter over `kubeapi.EventRecorder`, which aggregates repeats (count + lastTimestamp)
and never raises. Messages are written by the broker itself and never contain tokens.
"""

from __future__ import annotations

from control_plane_broker.model import KYMA_GROUP, KYMA_VERSION
from kubeapi import EventRecorder, ObjectRef


class KymaEvents:
    def __init__(self, recorder: EventRecorder, *, namespace: str) -> None:
        self._recorder = recorder
        self._namespace = namespace

    async def record(
        self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        await self._recorder.record(
            ObjectRef(
                api_version=f"{KYMA_GROUP}/{KYMA_VERSION}",
                kind="Kyma",
                name=kyma_name,
                namespace=self._namespace,
                uid=kyma_uid or None,
            ),
            type_="Warning" if warning else "Normal",
            reason=reason,
            message=message,
        )
