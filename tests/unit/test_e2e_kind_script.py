"""The kind end-to-end script refuses clearly, and before doing anything, without Docker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "devenv" / "kind" / "e2e.sh"


def _run_with_docker(tmp_path: Path, docker_script: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = os.environ["PATH"]
    if docker_script is None:
        # A PATH without any docker: only the folders that hold bash and coreutils.
        path = ":".join(p for p in path.split(":") if not (Path(p) / "docker").exists())
    else:
        fake = bin_dir / "docker"
        fake.write_text(docker_script)
        fake.chmod(0o755)
        path = f"{bin_dir}:{path}"
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_missing_docker_is_reported(tmp_path: Path) -> None:
    result = _run_with_docker(tmp_path, None)
    assert result.returncode != 0
    assert "docker is not installed" in result.stderr


def test_docker_without_engine_is_reported(tmp_path: Path) -> None:
    # A docker client whose engine does not answer, as on machines without a daemon.
    result = _run_with_docker(tmp_path, "#!/bin/sh\nexit 1\n")
    assert result.returncode != 0
    assert "no engine answers" in result.stderr
    assert "==>" not in result.stdout  # it stopped before the first step
