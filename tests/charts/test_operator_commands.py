"""The README's operator commands, run as written with the toolchain's kubectl (the release of the
API server) against a real control plane with a real broker: list the mappings, revoke a runtime
(its token requests get 403 runtime-revoked, the REVOKED column shows why), read its
annotations, look for Events, and lift the revocation (tokens flow again)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from devenv.clusters import Binaries, TestCluster
from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import BrokerFactory, seed_runtime, wait_for

COMMAND = re.compile(
    r"`(kubectl -n kcp-system [^`]*|kubectl get compassmanagermappings -n kcp-system)`"
)
REASON = "leaked credentials"


def readme_commands() -> list[str]:
    commands = list(dict.fromkeys(COMMAND.findall((REPO_ROOT / "README.md").read_text())))
    assert commands, "the README names no operator command"
    return commands


def kubectl(binaries: Binaries, cluster: TestCluster, command: str) -> str:
    assert command.startswith("kubectl ")
    result = subprocess.run(
        ["bash", "-c", command],
        env={
            **os.environ,
            "PATH": f"{binaries.folder}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    return result.stdout


def test_the_readme_operator_commands_run_with_the_toolchains_kubectl(
    binaries: Binaries,
    control_plane: TestCluster,
    runtime_a: TestCluster,
    kcp_ns: str,
    sim: Any,
    creds_file: Path,
) -> None:
    assert binaries.kubectl.exists()
    rt = seed_runtime(control_plane, kcp_ns, runtime_a)
    broker = BrokerFactory(control_plane, kcp_ns, sim, creds_file)()
    try:
        assert broker.request_token(rt.runtime_id, rt.token()).status_code == 201

        def filled(command: str) -> str:
            return (
                command.replace("kcp-system", kcp_ns)
                .replace("<kyma-name>", rt.kyma_name)
                .replace('"<why>"', f"'{REASON}'")
            )

        commands = {c: filled(c) for c in readme_commands()}
        ran = set()
        for original, command in commands.items():
            if "/unregister=" in command:
                continue  # drops the runtime from Compass: not part of this walk
            if "/revoked-" in command:
                continue  # run below, after the revocation
            kubectl(binaries, control_plane, command)
            ran.add(original)
            if "/revoked=" in command:
                r = wait_for(
                    lambda: (
                        (resp := broker.request_token(rt.runtime_id, rt.token())).status_code == 403
                        and resp
                    ),
                    what="the revocation to take effect",
                )
                assert r.json()["type"].endswith("runtime-revoked")
                assert REASON in r.json()["detail"]
        listed = kubectl(binaries, control_plane, filled("kubectl get cmm -n kcp-system"))
        assert "REVOKED" in listed
        assert REASON in listed
        annotations = kubectl(
            binaries,
            control_plane,
            filled(
                "kubectl -n kcp-system get compassmanagermapping <kyma-name> "
                "-o jsonpath='{.metadata.annotations}'"
            ),
        )
        assert REASON in annotations
        [lift] = [c for c in commands if "/revoked-" in c]
        kubectl(binaries, control_plane, commands[lift])
        ran.add(lift)
        wait_for(
            lambda: broker.request_token(rt.runtime_id, rt.token()).status_code == 201,
            what="tokens after the revocation is lifted",
        )
        assert REASON not in kubectl(
            binaries, control_plane, filled("kubectl get cmm -n kcp-system")
        )
        expected = {c for c in commands if "/unregister=" not in c}
        assert ran == expected
        assert len(ran) >= 5
    finally:
        broker.stop()
        broker.kill()
