"""The broker's Kubernetes adapters on `kubeapi`: Kyma and mapping views, the mapping
repository, runtime access and Kyma Events; no decisions are made here."""

from control_plane_broker.kube.caches import kyma_informer, mapping_informer
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kube.runtime_access import RuntimeAccess

__all__ = [
    "KymaEvents",
    "MappingRepository",
    "RuntimeAccess",
    "kyma_informer",
    "mapping_informer",
]
