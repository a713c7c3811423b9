"""A real Kubernetes node for a devenv cluster (issue 41).

`start_node_cluster(name)` starts etcd and kube-apiserver (devenv.clusters, configured for a
node) plus kube-controller-manager, kube-scheduler, containerd with runc and the CNI bridge
plugin, kube-proxy and the kubelet, and returns once the node is Ready. `NodeCluster.stop()`
stops them and leaves the host as it found it (devenv.node.host). Where the machine cannot run
a node, `host.unavailable_reason()` says why and starting raises NodeUnavailable.
See docs/real-node.md.
"""

from devenv.node.host import HostSnapshot, snapshot, unavailable_reason
from devenv.node.node import (
    HOST_IP,
    NODE_NAME,
    NodeBinaries,
    NodeBusy,
    NodeCluster,
    NodeError,
    NodeUnavailable,
    clean_leftovers,
    find_node_binaries,
    running_node_cluster,
    start_node_cluster,
)

__all__ = [
    "HOST_IP",
    "NODE_NAME",
    "HostSnapshot",
    "NodeBinaries",
    "NodeBusy",
    "NodeCluster",
    "NodeError",
    "NodeUnavailable",
    "clean_leftovers",
    "find_node_binaries",
    "running_node_cluster",
    "snapshot",
    "start_node_cluster",
    "unavailable_reason",
]
