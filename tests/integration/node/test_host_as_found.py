"""A real node leaves the host as it found it.

The test has the machine to itself (the session's shared node is stopped first): a snapshot of
what a node touches (node processes and pod processes, mounts, the node's sysctls, every cgroup,
network links, nft tables and ruleset, network namespaces, the host-wide paths) before a node
starts, while it runs pods, and after it stops. While it runs, all of them show the node; after,
none differs from before. The kubelet's kernel tunables (panic 10 s after any oops, overcommit
always) are put back as soon as the node is Ready, not only at the end.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from devenv.node import HOST_IP, NodeBusy, host, snapshot, start_node_cluster
from devenv.node import images as node_images
from tests.integration.node.conftest import (
    RESTRICTED,
    NodeSlot,
    deployment_condition,
    pause_deployment,
    pod_phase,
    probe_pod,
)
from tests.integration.waiting import wait_until


def test_a_node_with_pods_leaves_the_host_as_it_found_it(node_slot: NodeSlot) -> None:
    node_slot.release()
    before = snapshot()
    try:
        node = start_node_cluster("host-check")
    except NodeBusy as exc:  # a shared machine; CI runs alone
        pytest.skip(str(exc))
    try:
        running_sysctls = {k: host.read_sysctl(k) for k in host.KUBELET_TUNABLES}
        node.import_image(node_images.probe_archive())
        cluster = node.cluster
        namespace = cluster.create_namespace("host-check", labels=RESTRICTED)
        apps = client.AppsV1Api(cluster.api_client)
        apps.create_namespaced_deployment(namespace, pause_deployment("sleepers", replicas=2))
        cluster.core.create_namespaced_pod(namespace, probe_pod("probe-api", "10.0.0.1", 443))
        wait_until(
            lambda: deployment_condition(apps, namespace, "sleepers") == "True",
            within=60,
            what="the pause Deployment Available",
        )
        wait_until(
            lambda: pod_phase(cluster.core, namespace, "probe-api") in ("Succeeded", "Failed"),
            within=60,
            what="the probe pod to finish",
        )
        assert pod_phase(cluster.core, namespace, "probe-api") == "Succeeded", node.log_tail(
            "kubelet"
        )
        during = snapshot()
    finally:
        report = node.stop()
    after = snapshot()

    # The kubelet's tunables were the host's own again while the node ran.
    assert running_sysctls == {k: before.sysctls[k] for k in host.KUBELET_TUNABLES}
    # While it ran, the node showed in everything the snapshot looks at ...
    changed = before.differences(during)
    for kind in ("processes", "mounts", "cgroups", "links", "nft_tables", "netns"):
        assert any(line.startswith(f"{kind}: new") for line in changed), (kind, changed)
    assert any("kcpnode0" in line for line in changed)
    assert HOST_IP not in str(before.links)
    # ... and afterwards nothing differs from before, whatever stop() had to undo by force.
    assert before.differences(after) == [], report
    assert before.nft_ruleset == after.nft_ruleset
