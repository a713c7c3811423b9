"""`python -m devenv.node.figures`: the real node's figures for docs/real-node.md.

Starts a node, times it to Ready and to usable, times a pod of the pause image from create to
Ready (a few times), runs a 3-replica Deployment, then reads every node process's memory (RSS
and peak) and CPU over an idle minute, and times the stop. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from devenv.node import images
from devenv.node.host import NODE_EXECUTABLES
from devenv.node.node import NodeCluster, start_node_cluster

_TICKS = os.sysconf("SC_CLK_TCK")
_RESTRICTED = client.V1SecurityContext(
    allow_privilege_escalation=False,
    read_only_root_filesystem=True,
    run_as_non_root=True,
    run_as_user=65535,
    capabilities=client.V1Capabilities(drop=["ALL"]),
    seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
)


def _pod(name: str, labels: dict[str, str] | None = None) -> client.V1PodTemplateSpec:
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=2,
            containers=[
                client.V1Container(
                    name="pause",
                    image=images.pause_image_name(),
                    image_pull_policy="Never",
                    security_context=_RESTRICTED,
                )
            ],
        ),
    )


def _ready(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _wait(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("not within the time")
        time.sleep(0.05)


def _node_pids(node: NodeCluster) -> dict[int, str]:
    """Every process of the node: its daemons, etcd and the API server, shims and pod processes."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        exe = os.path.basename(argv[0].decode(errors="replace")) if argv[0] else ""
        mine = str(node.workdir) in " ".join(a.decode(errors="replace") for a in argv)
        if mine or "/kubepods" in cgroup or exe in NODE_EXECUTABLES:
            pids[int(entry.name)] = "pods" if "/kubepods" in cgroup else exe
    return pids


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=5, help="single pods timed one after another")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU measured")
    args = parser.parse_args()

    started = time.monotonic()
    node = start_node_cluster("figures")
    rows: list[tuple[str, str]] = []
    try:
        rows.append(("start to API server ready", f"{node.timings['apiserver_ready_s']:.1f} s"))
        rows.append(
            ("kubelet started to node Ready", f"{node.timings['kubelet_to_ready_s']:.1f} s")
        )
        rows.append(("start to node Ready", f"{node.timings['node_ready_s']:.1f} s"))
        rows.append(
            (
                "start to usable (kube-root-ca.crt, Service endpoints)",
                f"{node.timings['usable_s']:.1f} s",
            )
        )
        core = node.cluster.core
        namespace = node.cluster.create_namespace("figures")
        times = []
        for n in range(args.pods):
            name = f"pause-{n}"
            template = _pod(name)
            assert template.metadata is not None
            t = time.monotonic()
            core.create_namespaced_pod(
                namespace, client.V1Pod(metadata=template.metadata, spec=template.spec)
            )
            _wait(functools.partial(_ready, core, namespace, name))
            times.append(time.monotonic() - t)
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        rows.append(
            (
                f"pod create to Ready (pause image, {args.pods} pods, median / max)",
                f"{statistics.median(times):.2f} s / {max(times):.2f} s",
            )
        )
        apps = client.AppsV1Api(node.cluster.api_client)
        labels = {"app": "idle"}
        t = time.monotonic()
        apps.create_namespaced_deployment(
            namespace,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name="idle"),
                spec=client.V1DeploymentSpec(
                    replicas=3,
                    selector=client.V1LabelSelector(match_labels=labels),
                    template=_pod("idle", labels),
                ),
            ),
        )

        def available() -> bool:
            status = apps.read_namespaced_deployment_status("idle", namespace).status
            return bool(status and status.available_replicas == 3)

        _wait(available)
        rows.append(("3-replica Deployment create to Available", f"{time.monotonic() - t:.1f} s"))
        time.sleep(10)
        pids = _node_pids(node)
        before = {pid: _cpu_seconds(pid) for pid in pids}
        time.sleep(args.idle)
        used = sum(_cpu_seconds(pid) - before[pid] for pid in pids)
        rows.append(
            (
                f"idle CPU, all node processes with 3 pods ({args.idle:.0f} s)",
                f"{used:.1f} cpu-s ({100 * used / args.idle:.1f} % of one core)",
            )
        )
        memory = node.memory()
        total = sum(rss for rss, _ in memory.values())
        shims = [pid for pid, exe in pids.items() if exe.startswith("containerd-shim")]
        for name, (rss, peak) in sorted(memory.items(), key=lambda kv: -kv[1][0]):
            rows.append((f"RSS {name} (now / peak)", f"{rss / 1024:.0f} / {peak / 1024:.0f} MiB"))
        shim_rss = 0
        for pid in shims:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    shim_rss += int(line.split()[1])
        rows.append(
            (
                "RSS of the seven daemons, with 3 pods",
                f"{total / 1024:.0f} MiB + {shim_rss / 1024:.0f} MiB in {len(shims)} shims",
            )
        )
    finally:
        t = time.monotonic()
        report = node.stop()
        rows.append(("stop (drain pods, stop, restore the host)", f"{time.monotonic() - t:.1f} s"))
        if report:
            rows.append(("undone by force at stop", "; ".join(report)))
    rows.append(("whole run", f"{time.monotonic() - started:.0f} s"))
    print("| figure | value |\n|---|---|")
    for figure, value in rows:
        print(f"| {figure} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
