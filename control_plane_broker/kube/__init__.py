"""Small Kubernetes adapters over one async HTTP client; no decisions are made here."""

from control_plane_broker.kube.client import (
    Conflict,
    Gone,
    KubeClient,
    KubeError,
    KubeRejected,
    KubeUnavailable,
    NotFound,
)
from control_plane_broker.kube.config import ClusterAccess, KubeconfigError, load_kcp_access
from control_plane_broker.kube.events import EventRecorder
from control_plane_broker.kube.kyma_cache import KymaCache
from control_plane_broker.kube.lease import LeaderElector
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kube.runtime_access import RuntimeAccess

__all__ = [
    "ClusterAccess",
    "Conflict",
    "EventRecorder",
    "Gone",
    "KubeClient",
    "KubeError",
    "KubeRejected",
    "KubeUnavailable",
    "KubeconfigError",
    "KymaCache",
    "LeaderElector",
    "MappingRepository",
    "NotFound",
    "RuntimeAccess",
    "load_kcp_access",
]
