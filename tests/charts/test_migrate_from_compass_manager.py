"""docs/migrate-from-compass-manager.md step by step, on a control plane as compass-manager left it.

A cluster of its own (the CRD is cluster-wide, and the shared control plane has ours) gets
compass-manager's published CRD with client-side `kubectl apply` (tests/charts/fixtures, a copy
of kyma-project/compass-manager's, Apache-2.0), a stand-in of compass-manager's Deployment (an
object only: no pod runs here), Kymas and the mappings compass-manager would have written. Then
the guide's own shell blocks run, as written, with the toolchain's kubectl and helm; between
them, the real broker (as the chart's ServiceAccount, against the Compass simulator) meets each
kind of existing mapping the guide names.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv.clusters import Binaries, TestCluster, kyma_crds, start_cluster
from tests.charts import doc_steps
from tests.charts.doc_steps import shell
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import (
    GROUP,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)

DOC = REPO_ROOT / "docs" / "migrate-from-compass-manager.md"
COMPASS_MANAGER_CRD = Path(__file__).parent / "fixtures" / "compass-manager-crd.yaml"
NS = "kcp-system"
CRD = "compassmanagermappings.operator.kyma-project.io"
COMPASS_ID = "kyma-project.io/compass-runtime-id"
FINALIZER = "kyma-project.io/cm-protection"
CM_LABELS = {"app.kubernetes.io/component": "compass-manager.kyma-project.io"}
SUBSTITUTIONS = {"<compass-gateway>": "compass-gateway.example.test"}


def run_step(binaries: Binaries, cluster: TestCluster, name: str, **more: str) -> str:
    return doc_steps.run_step(binaries, cluster, DOC, name, SUBSTITUTIONS | more)


@pytest.fixture(scope="module")
def landscape(
    binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    """A control plane as compass-manager runs it: its CRD applied client-side, its Deployment."""
    cluster = start_cluster("cm-landscape", binaries, workdir=tmp_path_factory.mktemp("landscape"))
    try:
        cluster.apply_crds(kyma_crds(), timeout=90)
        cluster.create_namespace(NS)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "compass-manager", "namespace": NS, "labels": CM_LABELS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"control-plane": "compass-manager"}},
                "template": {
                    "metadata": {"labels": {"control-plane": "compass-manager"}},
                    "spec": {"containers": [{"name": "manager", "image": "compass-manager"}]},
                },
            },
        }
        client.AppsV1Api(cluster.api_client).create_namespaced_deployment(NS, deployment)
        applied = shell(binaries, cluster, f"kubectl apply -f {COMPASS_MANAGER_CRD}")
        assert applied.returncode == 0, applied.stderr
        cluster.apply_crds([COMPASS_MANAGER_CRD], timeout=90)  # waits until it is served
        yield cluster
    finally:
        cluster.stop()


def _mapping(cluster: TestCluster, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            GROUP, "v1beta1", NS, "compassmanagermappings", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _write_like_compass_manager(rt: Runtime, compass_id: str | None) -> None:
    """The mapping compass-manager keeps for a Kyma: labels, its finalizer, its status."""
    kyma = rt.kyma()
    assert kyma is not None
    labels = kyma["metadata"]["labels"]
    mapping_labels = {
        "operator.kyma-project.io/kyma-name": rt.kyma_name,
        "kyma-project.io/runtime-id": rt.runtime_id,
        "kyma-project.io/global-account-id": rt.tenant,
        "kyma-project.io/subaccount-id": labels["kyma-project.io/subaccount-id"],
    }
    if compass_id:
        mapping_labels[COMPASS_ID] = compass_id
    rt.kcp.custom.create_namespaced_custom_object(
        GROUP,
        "v1beta1",
        NS,
        "compassmanagermappings",
        {
            "apiVersion": f"{GROUP}/v1beta1",
            "kind": "CompassManagerMapping",
            "metadata": {"name": rt.kyma_name, "labels": mapping_labels, "finalizers": [FINALIZER]},
        },
    )
    rt.kcp.custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1beta1",
        NS,
        "compassmanagermappings",
        rt.kyma_name,
        {
            "status": {
                "registered": bool(compass_id),
                "configured": bool(compass_id),
                "state": "Ready",
            }
        },
    )


def _registered_by_compass_manager(sim: Any, rt: Runtime) -> str:
    """A Director runtime as compass-manager registers one: its name, no kyma_runtime_id."""
    kyma = rt.kyma()
    assert kyma is not None
    shoot = kyma["metadata"]["labels"]["kyma-project.io/shoot-name"]
    record = sim.seed_runtime(
        tenant=rt.tenant,
        name=f"{shoot}-AbCdEf",
        labels={
            "director_connection_managed_by": "compass-manager",
            "global_account_id": rt.tenant,
            "gardenerClusterName": shoot,
        },
    )
    return str(record.id)


def _attempts(sim: Any, operation: str) -> int:
    counter = sim.counters().get(operation)
    return 0 if counter is None else int(counter.attempts)


def _replicas(binaries: Binaries, cluster: TestCluster) -> str:
    out = shell(
        binaries,
        cluster,
        f"kubectl -n {NS} get deployment compass-manager -o jsonpath='{{.spec.replicas}}'",
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_migration_guide_step_by_step(
    binaries: Binaries,
    landscape: TestCluster,
    runtime_a: TestCluster,
    sim: Any,
    creds_file: Path,
) -> None:
    # --- the landscape: compass-manager's mappings, in all the kinds the guide names ---------
    adopted = seed_runtime(landscape, NS, runtime_a)  # registered, ID on the mapping
    unrecorded = seed_runtime(landscape, NS, runtime_a)  # registered, ID never recorded
    unmapped = seed_runtime(landscape, NS, runtime_a)  # no mapping, not in Compass
    leaving = seed_runtime(landscape, NS, runtime_a)  # registered, its Kyma deleted later
    adopted_id = _registered_by_compass_manager(sim, adopted)
    unrecorded_id = _registered_by_compass_manager(sim, unrecorded)
    leaving_id = _registered_by_compass_manager(sim, leaving)
    _write_like_compass_manager(adopted, adopted_id)
    _write_like_compass_manager(unrecorded, None)
    _write_like_compass_manager(leaving, leaving_id)

    # What the guide starts from: under compass-manager's CRD the broker's fields are pruned ...
    landscape.custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1beta1",
        NS,
        "compassmanagermappings",
        adopted.kyma_name,
        {"status": {"connection": {"state": "SynchronizationSucceeded"}}},
    )
    assert "connection" not in (_mapping(landscape, adopted.kyma_name) or {})["status"]
    # ... and a plain helm install fails on the fields kubectl's client-side apply owns.
    plain = shell(
        binaries,
        landscape,
        "helm install probe charts/compass-broker -n probe --create-namespace "
        "--set director.url=https://compass-gateway.example.test/director/graphql",
    )
    assert plain.returncode != 0
    assert 'conflict with "kubectl-client-side-apply"' in plain.stderr, plain.stderr
    shell(binaries, landscape, "helm uninstall probe -n probe --ignore-not-found")

    # --- 1. stop compass-manager's reconciler ----------------------------------------------
    listed = run_step(binaries, landscape, "stop")
    assert _replicas(binaries, landscape) == "0"
    assert adopted.kyma_name in listed

    # --- 2. the credentials, the CRD server-side, then helm; twice: install and upgrade -----
    credentials = {"<compass-manager credentials file>": str(creds_file)}
    run_step(binaries, landscape, "credentials", **credentials)
    secret = landscape.core.read_namespaced_secret("compass-manager-credentials", NS)
    assert base64.b64decode(secret.data["credentials.yaml"]) == creds_file.read_bytes()
    listed = run_step(binaries, landscape, "install")
    assert "REVOKED" in listed, listed
    assert "ENROLMENT PENDING" in listed, listed
    assert adopted_id in listed
    run_step(binaries, landscape, "install")
    history = shell(binaries, landscape, f"helm history compass-broker -n {NS} -o json")
    assert history.returncode == 0
    assert '"revision":2' in history.stdout.replace(" ", "")
    # The broker's fields are kept now.
    landscape.custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1beta1",
        NS,
        "compassmanagermappings",
        adopted.kyma_name,
        {"status": {"connection": {"state": "SynchronizationSucceeded"}}},
    )
    assert (_mapping(landscape, adopted.kyma_name) or {})["status"]["connection"] == {
        "state": "SynchronizationSucceeded"
    }
    landscape.custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1beta1",
        NS,
        "compassmanagermappings",
        adopted.kyma_name,
        {"status": {"connection": None}},
    )

    # --- 3. the broker, as the chart's ServiceAccount, meets each mapping -------------------
    token = landscape.service_account_token(NS, "compass-broker", audiences=[landscape.issuer])
    kubeconfig = landscape.workdir / "broker.kubeconfig"
    kubeconfig.write_text(landscape.kubeconfig_with_token(token, user="compass-broker"))
    factory = BrokerFactory(landscape, NS, sim, creds_file)
    broker = factory(KUBECONFIG=str(kubeconfig))
    try:
        # Adopted: labels brought in line without a token request, no registration.
        wait_for(
            lambda: (
                (sim.runtime(adopted_id).labels or {}).get("kyma_runtime_id") == adopted.runtime_id
            ),
            what="the adopted runtime's labels",
        )
        r = broker.request_token(adopted.runtime_id, adopted.token())
        assert r.status_code == 201, r.text
        assert r.json()["compassRuntimeID"] == adopted_id
        # No ID recorded: found by compass-manager's gardenerClusterName, then recorded.
        r = broker.request_token(unrecorded.runtime_id, unrecorded.token())
        assert r.status_code == 201, r.text
        assert r.json()["compassRuntimeID"] == unrecorded_id
        assert (_mapping(landscape, unrecorded.kyma_name) or {})["metadata"]["labels"][
            COMPASS_ID
        ] == unrecorded_id
        # No mapping and not in Compass: looked up, not found, registered once.
        assert _attempts(sim, "registerRuntime") == 0
        r = broker.request_token(unmapped.runtime_id, unmapped.token())
        assert r.status_code == 201, r.text
        assert _attempts(sim, "registerRuntime") == 1

        # A mapping deleted while its Kyma lives: re-adopted, neither registered nor dropped.
        before = _mapping(landscape, adopted.kyma_name)
        assert before is not None
        deleted = shell(
            binaries, landscape, f"kubectl -n {NS} delete cmm {adopted.kyma_name} --wait=false"
        )
        assert deleted.returncode == 0, deleted.stderr

        def readopted() -> bool:
            now = _mapping(landscape, adopted.kyma_name)
            return bool(
                now
                and now["metadata"]["uid"] != before["metadata"]["uid"]
                and now["metadata"]["labels"].get(COMPASS_ID) == adopted_id
            )

        wait_for(readopted, timeout=30, what="the deleted mapping to be recorded again")
        assert _attempts(sim, "registerRuntime") == 1
        assert sim.runtime(adopted_id) is not None
        # compass-manager's status fields come back with the runtime's next token (the guide
        # says so for a roll-back).
        recorded = _mapping(landscape, adopted.kyma_name) or {}
        assert "registered" not in (recorded.get("status") or {})
        r = broker.request_token(adopted.runtime_id, adopted.token())
        assert r.status_code == 201, r.text
        assert r.json()["compassRuntimeID"] == adopted_id

        # A Kyma deleted: its runtime unregistered, its mapping gone, as compass-manager did.
        leaving.delete_kyma()
        wait_for(lambda: sim.runtime(leaving_id) is None, timeout=30, what="unregistration")
        wait_for(lambda: _mapping(landscape, leaving.kyma_name) is None, what="mapping removal")
    finally:
        broker.stop()
        broker.kill()

    # --- 5. roll back: the release goes, the CRD and every mapping stay --------------------
    listed = run_step(binaries, landscape, "rollback")
    assert _replicas(binaries, landscape) == "1"
    crd = client.ApiextensionsV1Api(landscape.api_client).read_custom_resource_definition(CRD)
    assert crd.spec.names.short_names == ["cmm"]  # still the broker's superset
    expected = {adopted.kyma_name: adopted_id, unrecorded.kyma_name: unrecorded_id}
    for name, compass_id in expected.items():
        mapping = _mapping(landscape, name)
        assert mapping is not None, f"{name} went with the release"
        assert mapping["metadata"]["labels"][COMPASS_ID] == compass_id
        assert FINALIZER in mapping["metadata"]["finalizers"]
        assert mapping["status"].get("registered") is True, (name, mapping["status"])
        assert mapping["status"]["configured"] is True
        assert name in listed
    made = _mapping(landscape, unmapped.kyma_name)
    assert made is not None
    assert made["status"]["registered"] is True
    assert uuid.UUID(made["metadata"]["labels"][COMPASS_ID])
