"""docs/operations.md's procedures, step by step, as the migration guide's test runs that guide.

A control plane of its own (the chart's release and CRD are cluster-wide things the shared one
must not get) with the chart installed as the README installs it. Then every shell block of the
procedures runs as written, with the toolchain's kubectl and helm: upgrade and roll back the
release, then, with the real broker acting as the chart's ServiceAccount against the Compass
simulator, revoke and lift a runtime, approve a BYOC cluster's issuer, unregister a runtime and
rotate the Director credentials, each checked by what the broker then does. The read-only
`kubectl` commands of its troubleshooting section run there too.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.clusters import Binaries, TestCluster, kyma_crds, start_cluster
from tests.charts.doc_steps import doc_steps, run_step, shell
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import GROUP, BrokerFactory, seed_runtime, wait_for
from tests.integration.broker.test_byoc_enrolment import HttpsIssuers, byoc_runtime, until_issued
from tests.integration.broker.test_jwks_pinned_issuer import outcome, reissued

DOC = REPO_ROOT / "docs" / "operations.md"
NS = "kcp-system"
REASON = "leaked credentials"
DIRECTOR_URL = "https://compass-gateway.example.test/director/graphql"
READ_ONLY_COMMAND = re.compile(
    r"`(kubectl -n kcp-system [^`]*|kubectl get compassmanagermappings -n kcp-system)`"
)
TROUBLESHOOTING = "## When something looks wrong\n"


def troubleshooting_commands() -> list[str]:
    """The `kubectl` commands of operations.md's troubleshooting section, each once."""
    text = DOC.read_text()
    assert TROUBLESHOOTING in text, "operations.md has no troubleshooting section"
    section = text.split(TROUBLESHOOTING, 1)[1].split("\n## ", 1)[0]
    commands = list(dict.fromkeys(READ_ONLY_COMMAND.findall(section)))
    assert commands, "the troubleshooting section names no kubectl command"
    return commands


@pytest.fixture(scope="module")
def landscape(
    binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    cluster = start_cluster("ops", binaries, workdir=tmp_path_factory.mktemp("ops"))
    try:
        cluster.apply_crds(kyma_crds(), timeout=90)
        cluster.create_namespace(NS)
        yield cluster
    finally:
        cluster.stop()


def ok(binaries: Binaries, cluster: TestCluster, script: str) -> str:
    result = shell(binaries, cluster, script)
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def step(
    binaries: Binaries, cluster: TestCluster, name: str, fill: dict[str, str] | None = None
) -> str:
    return run_step(binaries, cluster, DOC, name, fill or {})


def secret_data(cluster: TestCluster) -> tuple[str, bytes]:
    found = cluster.core.read_namespaced_secret("compass-manager-credentials", NS)
    return found.metadata.uid, base64.b64decode(found.data["credentials.yaml"])


def test_every_procedure_runs_as_written(
    binaries: Binaries,
    landscape: TestCluster,
    runtime_a: TestCluster,
    sim: Any,
    creds_file: Path,
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    # --- installed as the README says ----------------------------------------------------
    ok(
        binaries,
        landscape,
        f"kubectl -n {NS} create secret generic compass-manager-credentials "
        f"--from-file=credentials.yaml={creds_file}\n"
        "kubectl apply --server-side --force-conflicts -f charts/compass-broker/crds/\n"
        f"helm upgrade --install compass-broker charts/compass-broker -n {NS} "
        f"--set director.url={DIRECTOR_URL}",
    )

    # --- upgrade: the CRD server-side, the release's own values kept ------------------------
    history = step(binaries, landscape, "upgrade")
    ran.append("upgrade")
    assert re.search(r"^2\s.*deployed\s.*Upgrade complete", history, re.MULTILINE), history
    assert DIRECTOR_URL in ok(binaries, landscape, f"helm get values compass-broker -n {NS}")

    # --- roll back: to the revision before ---------------------------------------------------
    history = step(binaries, landscape, "rollback")
    ran.append("rollback")
    assert re.search(r"^3\s.*deployed\s.*Rollback to 1", history, re.MULTILINE), history

    # --- the broker, as the chart's ServiceAccount --------------------------------------------
    token = landscape.service_account_token(NS, "compass-broker", audiences=[landscape.issuer])
    kubeconfig = landscape.workdir / "broker.kubeconfig"
    kubeconfig.write_text(landscape.kubeconfig_with_token(token, user="compass-broker"))
    issuers = HttpsIssuers(tmp_path)
    broker = BrokerFactory(landscape, NS, sim, creds_file)(
        KUBECONFIG=str(kubeconfig), BROKER_ISSUER_CA_FILE=str(issuers.ca_file)
    )
    try:
        rt = seed_runtime(landscape, NS, runtime_a)
        first = broker.request_token(rt.runtime_id, rt.token())
        assert first.status_code == 201, first.text
        compass_id = first.json()["compassRuntimeID"]

        # --- revoke: refused with the reason, and kubectl says so ---------------------------
        step(binaries, landscape, "revoke", {"<kyma-name>": rt.kyma_name, "<why>": REASON})
        ran.append("revoke")
        refused = wait_for(
            lambda: (r := broker.request_token(rt.runtime_id, rt.token())).status_code == 403 and r,
            what="the revocation to take effect",
        )
        assert outcome(refused) == (403, "runtime-revoked")
        assert REASON in refused.json()["detail"]
        row = wait_for(
            lambda: (
                (out := ok(binaries, landscape, f"kubectl -n {NS} get cmm {rt.kyma_name}"))
                and "Revoked" in out
                and out
            ),
            what="STATE Revoked",
        )
        assert re.search(r"\sRevoked\s+False\s+leaked credentials\s", row), row

        # The troubleshooting section's read-only commands, on a revoked runtime.
        for command in troubleshooting_commands():
            if " annotate " in command:
                continue
            ok(binaries, landscape, command.replace("<kyma-name>", rt.kyma_name))

        # --- lift: tokens again --------------------------------------------------------------
        step(binaries, landscape, "lift", {"<kyma-name>": rt.kyma_name})
        ran.append("lift")
        wait_for(
            lambda: broker.request_token(rt.runtime_id, rt.token()).status_code == 201,
            what="tokens after the revocation is lifted",
        )

        # --- approve a BYOC cluster's issuer -------------------------------------------------
        byoc = byoc_runtime(landscape, NS, runtime_a)
        issuers.serve_cluster_key("byoc", byoc)
        issuer = issuers.issuer("byoc")
        pending = broker.request_token(byoc.runtime_id, reissued(byoc, issuer=issuer))
        assert outcome(pending) == (403, "enrolment-pending"), pending.text
        wait_for(
            lambda: "EnrolmentPending" in ok(binaries, landscape, f"kubectl -n {NS} get events"),
            what="the EnrolmentPending Event",
        )
        shown = step(
            binaries,
            landscape,
            "approve",
            {"<kyma-name>": byoc.kyma_name, "<the issuer URL>": issuer},
        )
        ran.append("approve")
        assert issuer in shown  # the pending issuer, for the operator to check
        until_issued(broker, byoc.runtime_id, reissued(byoc, issuer=issuer))

        # --- unregister, the module off: gone from Compass, and not registered again ----------
        landscape.custom.patch_namespaced_custom_object(
            GROUP, "v1beta2", NS, "kymas", rt.kyma_name, {"spec": {"modules": []}}
        )
        modules = step(
            binaries, landscape, "unregister", {"<kyma-name>": rt.kyma_name, "<why>": REASON}
        )
        ran.append("unregister")
        assert "application-connector" not in modules
        wait_for(lambda: sim.runtime(compass_id) is None, timeout=30, what="unregistration")
        wait_for(lambda: rt.mapping() is None, what="the mapping's removal")
        refused = wait_for(
            lambda: (r := broker.request_token(rt.runtime_id, rt.token())).status_code != 201 and r,
            what="the module's removal to be seen",
        )
        assert refused.status_code == 409, refused.text
        assert sim.runtimes(rt.tenant) == []

        # --- rotate: the Secret replaced in place, which the kubelet swaps into the pods -------
        uid, before = secret_data(landscape)
        rotated = tmp_path / "rotated-credentials.yaml"
        rotated.write_text(before.decode().replace("client_secret:", "client_secret: new-"))
        step(binaries, landscape, "rotate", {"<new credentials file>": str(rotated)})
        ran.append("rotate")
        assert secret_data(landscape) == (uid, rotated.read_bytes())
    finally:
        broker.stop()
        broker.kill()
        issuers.stop()

    assert sorted(ran) == sorted(doc_steps(DOC)), "a procedure of operations.md is not run"
