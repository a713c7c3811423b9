"""A real node (devenv.node) for the tests that need pods.

One node per machine (host-wide cgroups, paths and pod network), so the session shares one:
`node_cluster` starts it the first time a test asks and `node_slot` stops it when the run ends.
A test that needs the machine to itself (test_host_as_found.py, which starts and stops its own;
test_demo_agent_pod.py, whose demo does) calls `node_slot.release()` before it begins; both run
before the others by file order. Where this machine
cannot run a node, every test here skips with the reason (devenv.node.unavailable_reason).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv import image
from devenv.clusters import Binaries, TestCluster, kyma_crds
from devenv.node import NodeBusy, NodeCluster, start_node_cluster, unavailable_reason
from devenv.node import images as node_images

# The broker's own harness (KCP seeding, Compass simulator, broker process), for the agent pod.
from tests.integration.broker.conftest import (  # noqa: F401 - fixtures are found by name
    AGENT_NS,
    broker_crds,
    brokers,
    creds_file,
    kcp_ns,
    sim,
)

UNAVAILABLE = unavailable_reason()

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# What the restricted Pod Security profile asks of every container.
RESTRICTED_CONTAINER = client.V1SecurityContext(
    allow_privilege_escalation=False,
    read_only_root_filesystem=True,
    run_as_non_root=True,
    run_as_user=65535,
    capabilities=client.V1Capabilities(drop=["ALL"]),
    seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
)


class NodeSlot:
    """The session's node: started on first use, stopped at the end or on `release()`."""

    def __init__(self) -> None:
        self.node: NodeCluster | None = None
        self.failed: BaseException | None = None
        self.figures: dict[str, float] = {}

    def shared(self) -> NodeCluster:
        if self.failed is not None:
            pytest.fail(f"the session's node did not start: {self.failed}")
        if self.node is None or not self.node.running:
            try:
                node = start_node_cluster("runtime-node")
            except NodeBusy as exc:  # a shared machine; CI runs alone
                pytest.skip(str(exc))
            except BaseException as exc:
                self.failed = exc
                raise
            self.node = node
            try:
                node.cluster.apply_crds(kyma_crds())
                node.import_image(node_images.probe_archive())
            except BaseException as exc:
                self.failed = exc
                self.release()
                raise
        return self.node

    def release(self) -> None:
        if self.node is not None:
            self.node.stop()
            self.node = None


@pytest.fixture(scope="session")
def node_slot() -> Iterator[NodeSlot]:
    if UNAVAILABLE:
        pytest.skip(f"no real node here: {UNAVAILABLE}")
    slot = NodeSlot()
    try:
        yield slot
    finally:
        slot.release()


@pytest.fixture
def node_cluster(node_slot: NodeSlot) -> NodeCluster:
    return node_slot.shared()


def pod_container(name: str, image: str, args: list[str] | None = None) -> client.V1Container:
    return client.V1Container(
        name=name,
        image=image,
        image_pull_policy="Never",
        args=args,
        security_context=RESTRICTED_CONTAINER,
        resources=client.V1ResourceRequirements(
            requests={"cpu": "5m", "memory": "8Mi"}, limits={"memory": "32Mi"}
        ),
    )


def pod_spec(containers: list[client.V1Container], **kwargs: Any) -> client.V1PodSpec:
    return client.V1PodSpec(
        containers=containers,
        termination_grace_period_seconds=2,
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
        **kwargs,
    )


def pause_deployment(name: str, replicas: int = 2) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=pod_spec([pod_container("pause", node_images.pause_image_name())]),
            ),
        ),
    )


def probe_pod(name: str, host: str, port: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=pod_spec(
            [pod_container("probe", node_images.probe_image_name(), [host, str(port)])],
            restart_policy="Never",
        ),
    )


def deployment_condition(
    apps: client.AppsV1Api, namespace: str, name: str, kind: str = "Available"
) -> str | None:
    try:
        deployment = apps.read_namespaced_deployment_status(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    for condition in (deployment.status and deployment.status.conditions) or []:
        if condition.type == kind:
            return str(condition.status)
    return None


def pod_phase(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str(pod.status.phase) if pod.status else None


def project_image(node: NodeCluster) -> str:
    """The project's image in the node's containerd (built by devenv/image.py, or its cache)."""
    problem = image.builder_problem()
    if problem is not None:
        pytest.skip(f"no image builder can run here: {problem}")
    name = image.image_name()
    if name not in node.images():
        try:
            # make test built it before pytest: found by the hash of its inputs in a second.
            archive = image.build_image()
        except image.NoBuilder as exc:
            pytest.skip(f"no image builder can run here: {exc}")
        node.import_image(archive)
    assert name in node.images()
    return name


def image_values(name: str) -> list[str]:
    """helm --set arguments that run `name` as imported (no registry to pull from)."""
    repository, _, tag = name.rpartition(":")
    return [
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
    ]


def helm(binaries: Binaries, node: NodeCluster, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [str(binaries.helm), "--kubeconfig", str(node.cluster.kubeconfig_path), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


TOKEN_SECRET = "compass-agent-configuration"
KYMA = ("operator.kyma-project.io", "v1beta2", "kymas")


def enable_module(cluster: TestCluster, runtime_id: str) -> None:
    """The runtime's own Kyma (kyma-system/default) with application-connector enabled."""
    body = {
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {
            "name": "default",
            "namespace": AGENT_NS,
            "labels": {"kyma-project.io/runtime-id": runtime_id},
        },
        "spec": {"channel": "regular", "modules": [{"name": "application-connector"}]},
    }
    cluster.custom.create_namespaced_custom_object(*KYMA[:2], AGENT_NS, KYMA[2], body)


def token_secret(cluster: TestCluster) -> dict[str, str] | None:
    """kyma-system/compass-agent-configuration, decoded, or None while there is none."""
    try:
        found = cluster.core.read_namespaced_secret(TOKEN_SECRET, AGENT_NS)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}


def remove_module_state(cluster: TestCluster) -> None:
    """The token secret and the runtime's Kyma, whichever exist: the next test's agent starts
    from nothing (the session shares one node)."""
    for delete in (
        lambda: cluster.core.delete_namespaced_secret(TOKEN_SECRET, AGENT_NS),
        lambda: cluster.custom.delete_namespaced_custom_object(
            *KYMA[:2], AGENT_NS, KYMA[2], "default"
        ),
    ):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise


def pod_logs(cluster: TestCluster, namespace: str, pods: list[Any]) -> str:
    """The end of the pods' logs, for a failure's message."""
    logs = []
    for pod in pods:
        try:
            logs.append(cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace))
        except ApiException as exc:
            logs.append(f"({pod.metadata.name}: no log, {exc.status})")
    return "\n".join(logs)[-4000:]
