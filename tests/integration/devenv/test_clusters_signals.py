"""`python -m devenv.clusters` stops what it started: etcd and kube-apiserver end with it on
SIGINT and on SIGTERM, also when it runs in the background (where a shell starts it with SIGINT
ignored), and removes the folder it wrote; the kubectl it names is the toolchain's, of the API
server's release."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devenv.clusters import Binaries
from tests.conftest import REPO_ROOT

LINE = re.compile(
    r"^(?P<name>\S+): (?P<server>\S+)  KUBECONFIG=(?P<kubeconfig>\S+)  kubectl: (?P<kubectl>\S+)$"
)


def _children(pid: int) -> set[int]:
    """Every process whose command line names the cluster's work folder (own sessions)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"kcp-sigtest-" in arg for arg in argv) and int(entry.name) != pid:
            found.add(int(entry.name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_background_cluster_stops_everything_on_the_signal(
    binaries: Binaries, signum: signal.Signals, tmp_path: Path
) -> None:
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(binaries.folder), "TMPDIR": str(tmp_path)}
    env.pop("KEEP_CLUSTER_WORKDIRS", None)
    # As `python -m devenv.clusters &` from a script: a background job has SIGINT ignored.
    proc = subprocess.Popen(
        # `trap '' INT` leaves SIGINT ignored across exec, as a background job has it.
        [
            "bash",
            "-c",
            "trap '' INT; exec \"$0\" -m devenv.clusters --name sigtest",
            sys.executable,
        ],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        match = LINE.match(line)
        assert match, (
            f"unexpected first line {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        )
        assert Path(match["kubectl"]) == binaries.kubectl
        # The kubectl it names talks to the cluster, and is of the API server's release.
        version = subprocess.run(
            [match["kubectl"], "version", "-o", "json"],
            env={**env, "KUBECONFIG": match["kubeconfig"]},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        versions = json.loads(version.stdout)
        assert versions["clientVersion"]["gitVersion"] == versions["serverVersion"]["gitVersion"]
        started = _alive(_children(proc.pid))
        assert len(started) == 2, f"expected etcd and kube-apiserver, found {started}"

        proc.send_signal(signum)
        assert proc.wait(30) == 0
        assert f"stopped ({signum.name})" in proc.stdout.read()
        deadline = time.monotonic() + 10
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(started) == set(), "etcd or kube-apiserver outlived devenv.clusters"
        # Its folder (etcd's data, private keys, logs) went with it: nothing left in TMPDIR.
        assert Path(match["kubeconfig"]).parent.parent == tmp_path
        assert list(tmp_path.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in _alive(_children(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
