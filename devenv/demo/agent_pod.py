"""`--agent-pod`: runtime A is a cluster with a real node (devenv.node) and its agent a real pod.

lifecycle-manager's manifest of the module runs as it is, with only what this machine needs
differently: the image is the one `make image` builds (imported into the node's containerd, as
there is no registry to pull from), the broker URL is the demo broker's plain-http address on the
node's host address (pods reach nothing else of this host; a managed runtime finds the broker from
lifecycle-manager's KCP_ADDR instead), and the demo's short timers. The kubelet projects the
agent's ServiceAccount token (audience compass-broker) and rotates it; the agent reaches its API
server in-cluster through the `kubernetes` Service. See docs/real-node.md.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devenv import image
from devenv.clusters import TestCluster
from devenv.node import NodeCluster, start_node_cluster, unavailable_reason

NAMESPACE = "kyma-system"
DEPLOYMENT = "compass-agent"
SELECTOR = "app.kubernetes.io/name=compass-agent"
HEALTH_PORT = 8080  # the module's AGENT_HEALTH_ADDRESS, on the pod's own address


def why_not_here() -> str | None:
    """Why runtime A cannot run on a real node here, or None (said before anything starts)."""
    if os.geteuid() != 0:
        return "--agent-pod needs root: a real node makes cgroups, a bridge and nft rules"
    reason = unavailable_reason()
    if reason:
        return f"--agent-pod: no real node on this machine: {reason}"
    problem = image.builder_problem()
    if problem is not None:
        return f"--agent-pod needs the project's image (make image): {problem}"
    return None


def prepare() -> tuple[Path | None, str | None]:
    """(the image's archive, None) or (None, why --agent-pod cannot work here): make image, or
    its cache in a second, once the machine can run a node."""
    why = why_not_here()
    if why is not None:
        return None, why
    try:
        return image.build_image(), None
    except (image.NoBuilder, image.BuildError) as exc:
        return None, f"--agent-pod: the project's image: {exc}"


def start_node(name: str, archive: Path) -> NodeCluster:
    """The runtime's cluster with a real node, the project's image in its containerd.

    In a folder of the node's own choosing (short, under the temporary folder): containerd's
    sockets live in it, and a unix socket's path may not be longer than 104 bytes."""
    node = start_node_cluster(name)
    try:
        node.import_image(archive)
    except BaseException:
        node.stop()
        raise
    return node


def pod_manifest(
    manifest: Sequence[Mapping[str, Any]], *, env: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The module's manifest with the agent's image set to make image's and `env` set in its
    container (a value of the manifest replaced by name, the rest kept)."""
    objects = [copy.deepcopy(dict(obj)) for obj in manifest]
    (deployment,) = [obj for obj in objects if obj.get("kind") == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["image"] = image.image_name()
    container["imagePullPolicy"] = "Never"  # no registry: imported, never pulled
    kept = [e for e in container.get("env") or [] if e["name"] not in env]
    container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return objects


def ready_pod_ip(cluster: TestCluster) -> str | None:
    """The agent pod's address once it is Ready (its readiness probe passed), else None."""
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    for pod in pods:
        if pod.metadata is None or pod.metadata.deletion_timestamp is not None:
            continue
        status = pod.status
        if status is not None and any(
            c.type == "Ready" and c.status == "True" for c in status.conditions or []
        ):
            return str(status.pod_ip)
    return None


def log_paths(node: NodeCluster) -> list[Path]:
    """The agent pods' logs as the kubelet writes them (`kubectl logs` reads the same files)."""
    return sorted(node.workdir.glob(f"node/pod-logs/{NAMESPACE}_{DEPLOYMENT}-*/*/*.log"))
