"""Smoke tests: the local clusters are real Kubernetes API servers, independent of each other."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devenv.clusters import Binaries, TestCluster, running_cluster
from tests.conftest import REPO_ROOT, NamespaceFactory
from tests.integration.waiting import wait_until

AUDIENCE = "compass-broker"


def _pinned_kubernetes_version() -> str:
    for line in (REPO_ROOT / "devenv/toolchain/versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return "v" + line.split("=", 1)[1].strip()
    raise AssertionError("KUBERNETES_VERSION missing from versions.env")


def _review(cluster: TestCluster, token: str, audiences: list[str]) -> client.V1TokenReviewStatus:
    review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
    status: client.V1TokenReviewStatus = (
        client.AuthenticationV1Api(cluster.api_client).create_token_review(review).status
    )
    return status


def test_version_is_the_pinned_release(control_plane: TestCluster) -> None:
    info = client.VersionApi(control_plane.api_client).get_code()
    assert info.git_version == _pinned_kubernetes_version()


def test_crd_can_be_installed_and_used(
    control_plane: TestCluster, namespace_factory: NamespaceFactory, tmp_path: Path
) -> None:
    crd = tmp_path / "widgets.yaml"
    crd.write_text(
        """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.example.com}
spec:
  group: smoke.example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties: {size: {type: integer, minimum: 1}}
"""
    )
    control_plane.apply_crds([crd])
    ns = namespace_factory(control_plane)
    widget = {
        "apiVersion": "smoke.example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    control_plane.custom.create_namespaced_custom_object(
        "smoke.example.com", "v1", ns, "widgets", widget
    )
    stored = control_plane.custom.get_namespaced_custom_object(
        "smoke.example.com", "v1", ns, "widgets", "w1"
    )
    assert stored["spec"] == {"size": 3}
    # The schema is enforced by the server, so this is a real API server and not an echo.
    invalid = {**widget, "metadata": {"name": "w2"}, "spec": {"size": 0}}
    with pytest.raises(ApiException) as refused:
        control_plane.custom.create_namespaced_custom_object(
            "smoke.example.com", "v1", ns, "widgets", invalid
        )
    assert refused.value.status == 422


def test_kyma_crds_are_installed_on_every_cluster(clusters: dict[str, TestCluster]) -> None:
    for cluster in clusters.values():
        ext = client.ApiextensionsV1Api(cluster.api_client)
        names = {crd.metadata.name for crd in ext.list_custom_resource_definition().items}
        assert {
            "kymas.operator.kyma-project.io",
            "applicationconnectors.operator.kyma-project.io",
            "compassconnections.compass.kyma-project.io",
        } <= names


def test_token_review_accepts_own_token_and_audience(
    runtime_a: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(runtime_a)
    token = runtime_a.service_account_token(ns, "compass-agent", audiences=[AUDIENCE])
    status = _review(runtime_a, token, [AUDIENCE])
    assert status.authenticated is True
    assert status.user.username == f"system:serviceaccount:{ns}:compass-agent"
    assert status.audiences == [AUDIENCE]


def test_token_review_rejects_token_of_another_cluster(
    runtime_a: TestCluster, runtime_b: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(runtime_a)
    token = runtime_a.service_account_token(ns, "compass-agent", audiences=[AUDIENCE])
    # Same namespace and name exist on B, so only the signing key tells the clusters apart.
    runtime_b.ensure_service_account(ns, "compass-agent")
    assert _review(runtime_b, token, [AUDIENCE]).authenticated is not True


def test_token_review_rejects_another_audience(
    runtime_a: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(runtime_a)
    token = runtime_a.service_account_token(ns, "compass-agent", audiences=[AUDIENCE])
    assert _review(runtime_a, token, ["someone-else"]).authenticated is not True


def test_identity_without_role_is_denied_by_rbac(
    runtime_a: TestCluster, namespace_factory: NamespaceFactory, tmp_path: Path
) -> None:
    ns = namespace_factory(runtime_a)
    token = runtime_a.service_account_token(ns, "nobody", audiences=[runtime_a.issuer])
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(runtime_a.kubeconfig_with_token(token))
    as_sa = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))

    with pytest.raises(ApiException) as denied:
        as_sa.list_namespaced_secret(ns)
    assert denied.value.status == 403

    # The same call succeeds once a Role allows it: the 403 above came from RBAC.
    rbac = client.RbacAuthorizationV1Api(runtime_a.api_client)
    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="read-secrets"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=ns)],
        ),
    )

    # The authorizer sees new RBAC objects through its informers, a moment after they are written.
    def allowed() -> bool:
        try:
            return as_sa.list_namespaced_secret(ns).items == []
        except ApiException as exc:
            if exc.status == 403:
                return False
            raise

    wait_until(allowed, within=10, what="the Role to take effect in the authorizer")


def test_clusters_do_not_share_state(
    runtime_a: TestCluster, runtime_b: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(runtime_a)
    name = f"only-on-a-{uuid.uuid4().hex[:6]}"
    runtime_a.core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
    )
    with pytest.raises(ApiException) as missing:
        runtime_b.core.read_namespaced_config_map(name, ns)
    assert missing.value.status == 404


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_stopping_a_cluster_leaves_no_process_or_port(binaries: Binaries) -> None:
    with running_cluster("short-lived", binaries) as cluster:
        processes = list(cluster._processes)
        port = cluster.port
        assert cluster.running
        assert not _port_is_free(port)
    assert all(proc.poll() is not None for proc in processes)
    assert _port_is_free(port)
