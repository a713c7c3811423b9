"""Renders the project's charts with the real `helm` and applies the result to a real API server.

Objects are sent with plain HTTP requests (admin client certificate) rather than through
the Kubernetes client, so the `Warning` headers of Pod Security admission can be read:
for Deployments the restricted profile only warns, and a warning is a failure here.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from devenv.clusters import Binaries, TestCluster
from tests.conftest import REPO_ROOT

CHARTS = REPO_ROOT / "charts"

# kind -> (API path prefix, plural, namespaced)
_RESOURCES: dict[str, tuple[str, str, bool]] = {
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Pod": ("/api/v1", "pods", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
}


class HelmError(AssertionError):
    pass


def helm(binaries: Binaries, *args: str) -> str:
    result = subprocess.run(
        [str(binaries.helm), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout + result.stderr


def render(
    binaries: Binaries,
    chart: str,
    *,
    namespace: str,
    values: Mapping[str, str] | None = None,
    include_crds: bool = True,
) -> list[dict[str, Any]]:
    args = ["template", "release", str(CHARTS / chart), "--namespace", namespace]
    if include_crds:
        args.append("--include-crds")
    for key, value in (values or {}).items():
        args += ["--set", f"{key}={value}"]
    return [doc for doc in yaml.safe_load_all(helm(binaries, *args)) if doc]


@dataclass
class Applied:
    objects: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _admin_http(cluster: TestCluster) -> httpx.Client:
    pki = cluster.workdir / "pki"
    tls = ssl.create_default_context(cafile=str(cluster.ca_file))
    tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return httpx.Client(base_url=cluster.server, verify=tls, timeout=30)


def _collection_url(obj: Mapping[str, Any], namespace: str) -> str:
    kind = obj["kind"]
    if kind not in _RESOURCES:
        raise AssertionError(f"render.py does not know how to apply {kind}")
    prefix, plural, namespaced = _RESOURCES[kind]
    ns = obj["metadata"].get("namespace", namespace)
    return f"{prefix}/namespaces/{ns}/{plural}" if namespaced else f"{prefix}/{plural}"


def apply(cluster: TestCluster, objects: Sequence[dict[str, Any]], *, namespace: str) -> Applied:
    """Creates each object (replacing one that exists) and collects admission warnings."""
    result = Applied()
    with _admin_http(cluster) as http:
        for obj in objects:
            url = _collection_url(obj, namespace)
            response = http.post(url, json=obj)
            if response.status_code == 409:
                name = obj["metadata"]["name"]
                current = http.get(f"{url}/{name}").json()
                version = current["metadata"]["resourceVersion"]
                replacement = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
                response = http.put(f"{url}/{name}", json=replacement)
            if response.status_code >= 300:
                raise AssertionError(
                    f"{obj['kind']}/{obj['metadata']['name']} refused: "
                    f"{response.status_code} {response.json().get('message')}"
                )
            result.warnings += response.headers.get_list("warning")
            result.objects.append(response.json())
    return result


def pods_from_templates(objects: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One Pod per Deployment pod template: there is no controller here to make them."""
    pods = []
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        template = obj["spec"]["template"]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{obj['metadata']['name']}-admission-check",
                    "labels": template["metadata"].get("labels", {}),
                },
                "spec": template["spec"],
            }
        )
    return pods


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def crd_paths(chart: str) -> list[Path]:
    return sorted((CHARTS / chart / "crds").glob("*.yaml"))
