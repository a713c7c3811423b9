"""`python -m devenv.node`: a cluster with a real node, for a person at a terminal and for make.

python -m devenv.node            start one, print its kubeconfig, stop it on Ctrl-C or SIGTERM
python -m devenv.node --prepare  build what a node needs (the toolchain's kubelet,
                                 kube-controller-manager, kube-scheduler, kube-proxy, the
                                 pause and probe images) before the tests run; where this
                                 machine cannot run a node, say why and exit 0 (the tests
                                 that need one skip)
python -m devenv.node --clean    undo what a node that was never stopped left on this host
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from devenv import clusters
from devenv.node import host, images
from devenv.node.node import clean_leftovers, find_node_binaries, running_node_cluster


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", default="node")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--prepare", action="store_true")
    action.add_argument("--clean", action="store_true")
    args = parser.parse_args()

    if args.clean:
        for line in clean_leftovers():
            print(line)
        return 0
    reason = host.unavailable_reason()
    if args.prepare:
        if reason:
            print(f"devenv.node: no real node on this machine: {reason}", file=sys.stderr)
            return 0
        start = time.monotonic()
        find_node_binaries()
        images.pause_archive()
        images.probe_archive()
        print(f"devenv.node: ready ({time.monotonic() - start:.0f}s)", file=sys.stderr)
        return 0
    if reason:
        print(f"devenv.node: this machine cannot run a node: {reason}", file=sys.stderr)
        return 3
    clusters._stop_on_signals()
    try:
        with running_node_cluster(args.name) as node:
            figures = ", ".join(f"{k} {v:.1f}" for k, v in node.timings.items())
            print(
                f"{node.name} Ready ({figures}); KUBECONFIG={node.cluster.kubeconfig_path}",
                flush=True,
            )
            while True:
                signal.pause()
    except clusters._Stopped as stopped:
        print(f"stopped ({stopped})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
