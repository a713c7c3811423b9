"""The node runs real pods: scheduled by kube-scheduler, started by the kubelet through containerd
and runc on the CNI bridge, their Deployment's status written by kube-controller-manager, their
ServiceAccount tokens projected by the kubelet, the `kubernetes` Service routed by kube-proxy.
Every pod runs under the restricted Pod Security profile, from images imported with ctr.
"""

from __future__ import annotations

import ipaddress
import time

from kubernetes import client

from devenv.node import HOST_IP, NODE_NAME, NodeCluster
from devenv.node import images as node_images
from tests.integration.node.conftest import (
    RESTRICTED,
    deployment_condition,
    pause_deployment,
    pod_container,
    pod_phase,
    pod_spec,
    probe_pod,
)
from tests.integration.waiting import wait_until

POD_NETWORK = ipaddress.ip_network("10.77.0.0/16")


def test_the_node_is_ready_with_its_version_and_address(node_cluster: NodeCluster) -> None:
    node = node_cluster.cluster.core.read_node(NODE_NAME)
    assert node.status.node_info.kubelet_version == "v1.37.2"
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.")
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == HOST_IP
    assert not node.spec.taints
    print("node figures (s):", node_cluster.timings)


def test_a_deployment_becomes_available_with_pods_on_the_bridge(
    node_cluster: NodeCluster,
) -> None:
    cluster = node_cluster.cluster
    namespace = cluster.create_namespace("pods-deployment", labels=RESTRICTED)
    apps = client.AppsV1Api(cluster.api_client)
    started = time.monotonic()
    apps.create_namespaced_deployment(namespace, pause_deployment("pause", replicas=2))
    wait_until(
        lambda: deployment_condition(apps, namespace, "pause") == "True",
        within=60,
        what="the Deployment Available",
    )
    available_after = time.monotonic() - started
    pods = cluster.core.list_namespaced_pod(namespace, label_selector="app=pause").items
    assert len(pods) == 2
    for pod in pods:
        assert pod.spec.node_name == NODE_NAME
        assert ipaddress.ip_address(pod.status.pod_ip) in POD_NETWORK
        assert all(s.ready for s in pod.status.container_statuses)
        # ServiceAccount admission gave it the API token volume.
        assert any(v.name.startswith("kube-api-access-") for v in pod.spec.volumes)
    print(f"2-replica Deployment Available {available_after:.1f}s after create")


def test_the_kubernetes_service_reaches_the_api_server_from_a_pod(
    node_cluster: NodeCluster,
) -> None:
    cluster = node_cluster.cluster
    namespace = cluster.create_namespace("pods-service", labels=RESTRICTED)
    cluster.core.create_namespaced_pod(namespace, probe_pod("to-api", "10.0.0.1", 443))
    # And to this host on the bridge (where a broker would listen): the API server's own port.
    cluster.core.create_namespaced_pod(namespace, probe_pod("to-host", HOST_IP, cluster.port))
    for name in ("to-api", "to-host"):
        wait_until(
            lambda name=name: pod_phase(cluster.core, namespace, name) in ("Succeeded", "Failed"),
            within=60,
            what=f"pod {name} finished",
        )
        log = cluster.core.read_namespaced_pod_log(name, namespace)
        assert pod_phase(cluster.core, namespace, name) == "Succeeded", log
        assert "probe: connected" in log


def test_the_kubelet_projects_an_audience_bound_token_the_api_server_accepts(
    node_cluster: NodeCluster,
) -> None:
    cluster = node_cluster.cluster
    namespace = cluster.create_namespace("pods-token", labels=RESTRICTED)
    cluster.ensure_service_account(namespace, "agent")
    volume = client.V1Volume(
        name="broker-token",
        projected=client.V1ProjectedVolumeSource(
            sources=[
                client.V1VolumeProjection(
                    service_account_token=client.V1ServiceAccountTokenProjection(
                        path="token", audience="compass-broker", expiration_seconds=600
                    )
                )
            ]
        ),
    )
    container = pod_container("pause", node_images.pause_image_name())
    container.volume_mounts = [
        client.V1VolumeMount(name="broker-token", mount_path="/var/run/secrets/broker")
    ]
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="holder"),
        spec=pod_spec([container], service_account_name="agent", volumes=[volume]),
    )
    created = cluster.core.create_namespaced_pod(namespace, pod)
    wait_until(
        lambda: pod_phase(cluster.core, namespace, "holder") == "Running",
        within=60,
        what="the pod Running",
    )
    # What the container reads, as the kubelet wrote it into the pod's volume.
    token_file = (
        node_cluster.workdir
        / "node"
        / "kubelet"
        / "pods"
        / str(created.metadata.uid)
        / "volumes"
        / "kubernetes.io~projected"
        / "broker-token"
        / "token"
    )
    token = wait_until(
        lambda: token_file.read_text() if token_file.exists() else "",
        within=10,
        what="the projected token",
    )
    review = client.AuthenticationV1Api(cluster.api_client).create_token_review(
        client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=["compass-broker"])
        )
    )
    assert review.status.authenticated, review.status.error
    assert review.status.user.username == f"system:serviceaccount:{namespace}:agent"
    assert review.status.user.extra["authentication.kubernetes.io/pod-name"] == ["holder"]
    assert review.status.user.extra["authentication.kubernetes.io/node-name"] == [NODE_NAME]
    # Another audience does not accept it.
    other = client.AuthenticationV1Api(cluster.api_client).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=["someone-else"]))
    )
    assert not other.status.authenticated
