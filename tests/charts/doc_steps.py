"""A doc's shell blocks as tests run them: the block after `<!-- step: NAME -->`, placeholders
filled, run by bash (`-euo pipefail`) from the repository root with the toolchain's kubectl and
helm first on PATH, against one cluster."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from devenv.clusters import Binaries, TestCluster
from tests.conftest import REPO_ROOT


def doc_step(doc: Path, name: str, substitutions: Mapping[str, str]) -> str:
    match = re.search(
        rf"<!-- step: {re.escape(name)} -->\n```sh\n(.*?)```", doc.read_text(), re.DOTALL
    )
    assert match, f"{doc.name} has no shell block for step {name!r}"
    script = match.group(1)
    for placeholder, value in substitutions.items():
        script = script.replace(placeholder, value)
    assert "<" not in script, f"step {name!r} has a placeholder the test does not fill"
    return script


def doc_steps(doc: Path) -> list[str]:
    """The names of every step in `doc`, in order."""
    return re.findall(r"<!-- step: (\S+) -->", doc.read_text())


def shell(
    binaries: Binaries, cluster: TestCluster, script: str
) -> subprocess.CompletedProcess[str]:
    """Runs `script` from the repository root with the toolchain's kubectl and helm first."""
    env = {
        **os.environ,
        "PATH": f"{binaries.folder}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig_path),
        "HELM_CACHE_HOME": str(cluster.workdir / "helm-cache"),
        "HELM_CONFIG_HOME": str(cluster.workdir / "helm-config"),
        "HELM_DATA_HOME": str(cluster.workdir / "helm-data"),
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def run_step(
    binaries: Binaries,
    cluster: TestCluster,
    doc: Path,
    name: str,
    substitutions: Mapping[str, str],
) -> str:
    result = shell(binaries, cluster, doc_step(doc, name, substitutions))
    assert result.returncode == 0, f"step {name!r} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout
