"""Kubernetes Events (core/v1) that tell an admin what the agent did and why.

Always holds: an event message never contains a token; failing to record an event never
fails the reconcile (events are best effort, the log has the same facts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from agent.kube import resources
from agent.kube.api import KubeClient, KubeError
from agent.model import format_time

log = logging.getLogger(__name__)

COMPONENT = "compass-agent"


class EventReason(StrEnum):
    TOKEN_PULLED = "TokenPulled"  # noqa: S105 - a name, not a password
    PULL_REFUSED = "PullRefused"
    CONNECTION_FAILURE_SEEN = "ConnectionFailureSeen"
    SECRET_REMOVED = "SecretRemoved"  # noqa: S105 - a name, not a password


WARNINGS = frozenset({EventReason.PULL_REFUSED, EventReason.CONNECTION_FAILURE_SEEN})


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str | None = None


class EventRecorder:
    def __init__(self, client: KubeClient, *, namespace: str, host: str) -> None:
        self._client = client
        self._namespace = namespace
        self._host = host

    async def record(
        self, about: ObjectRef, reason: EventReason, message: str, *, now: datetime
    ) -> None:
        stamp = format_time(now)
        involved: dict[str, str] = {
            "apiVersion": about.api_version,
            "kind": about.kind,
            "namespace": about.namespace,
            "name": about.name,
        }
        if about.uid:
            involved["uid"] = about.uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about.name}.", "namespace": self._namespace},
            "involvedObject": involved,
            "reason": str(reason),
            "message": message[:1024],
            "type": "Warning" if reason in WARNINGS else "Normal",
            "source": {"component": COMPONENT, "host": self._host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._host,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self._client.create(resources.events(self._namespace), body)
        except KubeError as e:
            log.warning("could not record event", extra={"reason": str(reason), "error": str(e)})
