"""`make demo DEMO_ARGS=--agent-pod` (issue 41, item 6): the whole story with runtime A on a real
node and its agent a pod of the module's manifest and make image's image; and `--all-real`
(issue 36, item 6), where the real lifecycle-manager installs that pod and reads the status the
node's controller manager writes, with the real Director, Connector and compass-runtime-agent.

The demo starts its own node (one per machine): the session's is stopped first, and the next
test that needs one starts it again. The story is the one tests/integration/test_demo.py checks;
here also that agent A was a pod (no agent-a process, its pod Ready, its token the kubelet's) and
that the node stopped with the demo, leaving the host as it found it (devenv.node.host's
snapshot, as test_host_as_found.py compares it).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from devenv.demo import cli
from devenv.node import HOST_IP, host
from tests.conftest import REPO_ROOT
from tests.integration.node.conftest import NodeSlot
from tests.integration.test_demo import (
    check_lifecycle_manager,
    check_story,
    check_whole_real_story,
    demo_command,
    leftovers,
    summary_rows,
)

pytestmark = pytest.mark.timeout(600)


def run_on_the_node(node_slot: NodeSlot, workdir: Path, *options: str) -> str:
    """The demo's output; it ran to the end, left no process, and its node stopped with it,
    leaving the host as it found it."""
    node_slot.release()
    before = host.snapshot()
    result = subprocess.run(
        demo_command(workdir, *options, "--timeout-scale", "2"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"demo failed:\n{out[-6000:]}\n{result.stderr[-3000:]}"
    assert leftovers(workdir) == []
    assert before.differences(host.snapshot()) == []
    return out


def check_agent_a_was_a_pod(out: str, workdir: Path) -> None:
    assert "runtime-a has a real node" in out
    assert "agent A's pod Ready" in out
    assert f"broker http://{HOST_IP}:" in out
    assert not (workdir / "logs" / "agent-a.log").exists()


def test_the_demo_runs_runtime_a_agent_as_a_real_pod(node_slot: NodeSlot, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    out = run_on_the_node(node_slot, workdir, "--agent-pod")
    check_story(
        out, compass="Compass simulator", runtime_agent_b="compass-runtime-agent (simulated)"
    )
    check_agent_a_was_a_pod(out, workdir)
    assert "the Deployment runs as a pod" in out
    assert (workdir / "logs" / "agent-b.log").stat().st_size > 0
    row = summary_rows(out)["runtime A (managed)"]
    assert (row["secret"], row["connection"], row["in Compass"]) == (
        "yes",
        "Connected",
        "unregistered",
    )


def test_the_whole_real_path_with_runtime_a_on_the_node(
    node_slot: NodeSlot, tmp_path: Path
) -> None:
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--all-real"]))
    if refusal is not None:
        pytest.skip(refusal)
    workdir = tmp_path / "demo"
    out = run_on_the_node(node_slot, workdir, "--all-real")
    check_whole_real_story(out)
    check_agent_a_was_a_pod(out, workdir)
    # KLM installed the pod and read the controller manager's status: module and Kyma Ready.
    check_lifecycle_manager(out, workdir, on_node=True)
    assert (
        "Real counterparts: Compass Director, Connector, hydrator, Oathkeeper, lifecycle-manager "
        "(runtime A's module), compass-runtime-agent (runtime B), a node with kubelet and "
        "containerd (runtime A)"
    ) in out


def test_the_option_is_refused_at_once_where_no_node_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not root: no node (cgroups, a bridge, nft rules); said before anything starts or builds.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["--workdir", str(tmp_path / "demo"), "--agent-pod"]) == 2
    assert not (tmp_path / "demo").exists()
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--agent-pod"]))
    assert refusal == "--agent-pod needs root: a real node makes cgroups, a bridge and nft rules"
