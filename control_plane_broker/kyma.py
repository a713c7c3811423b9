"""Typed views of the Kubernetes objects the broker reads, parsed once at the edge.

A `KymaView` is immutable; everything downstream decides on it, never on raw JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

LABEL_RUNTIME_ID = "kyma-project.io/runtime-id"
LABEL_GLOBAL_ACCOUNT = "kyma-project.io/global-account-id"
LABEL_SUBACCOUNT = "kyma-project.io/subaccount-id"
LABEL_SHOOT = "kyma-project.io/shoot-name"
LABEL_INSTANCE = "kyma-project.io/instance-id"
LABEL_PLAN_ID = "kyma-project.io/broker-plan-id"
LABEL_PLAN_NAME = "kyma-project.io/broker-plan-name"
LABEL_REGION = "kyma-project.io/region"
LABEL_KYMA_NAME = "operator.kyma-project.io/kyma-name"
LABEL_COMPASS_ID = "kyma-project.io/compass-runtime-id"

KYMA_GROUP = "operator.kyma-project.io"
KYMA_VERSION = "v1beta2"
MAPPING_VERSION = "v1beta1"


@dataclass(frozen=True)
class KymaView:
    name: str
    namespace: str
    uid: str
    resource_version: str
    labels: dict[str, str] = field(default_factory=dict)
    deleting: bool = False
    spec_modules: frozenset[str] = frozenset()
    status_modules: frozenset[str] = frozenset()
    created_at: float | None = None  # metadata.creationTimestamp, epoch seconds

    @property
    def runtime_id(self) -> str:
        return self.labels.get(LABEL_RUNTIME_ID, self.name)

    @property
    def tenant(self) -> str | None:
        return self.labels.get(LABEL_GLOBAL_ACCOUNT) or None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> KymaView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            deleting=bool(meta.get("deletionTimestamp")),
            spec_modules=frozenset(
                str(m.get("name")) for m in spec.get("modules") or [] if isinstance(m, dict)
            ),
            status_modules=frozenset(
                str(m.get("name")) for m in status.get("modules") or [] if isinstance(m, dict)
            ),
            created_at=_epoch(meta.get("creationTimestamp")),
        )


def _epoch(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None
