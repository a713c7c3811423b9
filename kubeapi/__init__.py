"""One small Kubernetes layer for every component: cluster access, a REST client, informers,
leader election and Events, on httpx (no official client, no exec plugins).

Public names are `__all__` and nothing else; the modules behind them are the layer's own:

- `kube_errors`: the error tree (`KubeError` and its subclasses, `KubeconfigError`);
- `config`: `ClusterAccess` and its loaders (an untrusted kubeconfig, one's own, in-cluster);
- `client`: `KubeClient` (verbs, paging, watch) with `Listing` and `WatchEvent`;
- `informer`: `Informer[T]`, list + watch into a store;
- `lease`: `LeaderElector`;
- `event_recorder`: `EventRecorder` and `ObjectRef`;
- `transport`: `describe_transport_error`, what a failed request says about server and cause.
"""

from kubeapi.client import JSON, KubeClient, Listing, WatchEvent
from kubeapi.config import (
    ClusterAccess,
    access_from_kubeconfig_file,
    access_from_untrusted_kubeconfig,
    in_cluster_access,
    load_access,
)
from kubeapi.event_recorder import EventRecorder, ObjectRef
from kubeapi.informer import Informer
from kubeapi.kube_errors import (
    Conflict,
    Gone,
    KubeconfigError,
    KubeError,
    KubeRejected,
    KubeUnavailable,
    NotFound,
)
from kubeapi.lease import LeaderElector
from kubeapi.transport import describe_transport_error

__all__ = [
    "JSON",
    "ClusterAccess",
    "Conflict",
    "EventRecorder",
    "Gone",
    "Informer",
    "KubeClient",
    "KubeError",
    "KubeRejected",
    "KubeUnavailable",
    "KubeconfigError",
    "LeaderElector",
    "Listing",
    "NotFound",
    "ObjectRef",
    "WatchEvent",
    "access_from_kubeconfig_file",
    "access_from_untrusted_kubeconfig",
    "describe_transport_error",
    "in_cluster_access",
    "load_access",
]
