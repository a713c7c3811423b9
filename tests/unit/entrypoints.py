"""Runs `python -m agent` or `python -m control_plane_broker` as a user would: only the settings
the test gives, none of the caller's BROKER_/AGENT_ variables or kubeconfig."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def run(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "AGENT_"))}
    clean.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
    )
