"""Command line of the demo: arguments, signals, exit codes.

Exit codes: 0 when every step happened (with `--keep`: after Ctrl-C), 1 when a step did not
happen in time or something broke (the message says which, with the tail of the relevant
logs), 2 when an option cannot work here (said at once, before anything starts), 130 when
interrupted before the end. Whatever the outcome, every process the demo
started is stopped before it exits; SIGTERM and SIGHUP are handled like Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devenv import runtime_agent
from devenv.demo import agent_pod
from devenv.demo import klm as real_klm
from devenv.demo.console import StepFailed, Story
from devenv.demo.processes import log_tail
from devenv.demo.story import Demo, Options
from devenv.real_director import connector as real_connector
from devenv.real_director import find_compass_source

DESCRIPTION = """\
The local demo of kyma-compass-pull: a control-plane API server (KCP) and two runtime API
servers (A: a managed runtime, B: bring your own cluster), the Compass simulator, the broker,
one agent and one simulated compass-runtime-agent per runtime, all as local processes on
127.0.0.1. It tells the story step by step: the module is enabled in runtime A and A connects;
Compass goes down; the module is enabled in runtime B and B's agent backs off; Compass comes
back and B connects; A's Kyma is deleted in KCP and A is unregistered from Compass. It ends
with a summary table and exits 0, or 1 with a clear message when a step does not happen in
time."""

EPILOG = """\
--real-director runs the real Compass Director (built once from the pinned source, see
docs/real-compass.md) behind our gateway instead of the simulator; --real-runtime-agent runs
Kyma's compass-runtime-agent in runtime B (root and unshare needed; built by `make demo`).
--real-connector adds the real Compass Connector, hydrator and Oathkeeper to --real-director
(root and unshare needed; built by `make real-compass`): with --real-runtime-agent too, the whole
token and certificate path is Compass's own and Kyma's. Both together work too. The simulator
stays the default: no build, and the faults and scale
the real one cannot give (docs/compass-simulator.md). --agent-pod gives runtime A a real node
(devenv/node: kubelet, containerd, runc, controller manager, scheduler, kube-proxy) where its
agent runs as a pod from the module's manifest and make image's image, with its kubelet-projected
token; it combines with the others.
--klm lets the real lifecycle-manager (built once by `make klm`, docs/module.md) install the
agent's module in runtime A from make module's output in a local OCI registry, instead of the
demo's imitation. --all-real is the whole real path in one option: --real-director
--real-connector --real-runtime-agent --klm --agent-pod, refused where one of them cannot run
(what is still a stand-in: docs/real-compass.md).

Logs of every process go to <work folder>/logs; the list of processes (pid, command) to
<work folder>/processes.json. Keys, tokens and cluster data are removed when the demo stops.
Set KUBEBUILDER_ASSETS to use existing kube-apiserver and etcd binaries instead of the ones
`make demo` builds into ~/.cache/kyma-compass-pull."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.demo",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the story, leave everything running and print how to reach it, until Ctrl-C",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="work folder for logs and cluster data (default: a new temporary folder)",
    )
    parser.add_argument(
        "--outage",
        choices=["refuse", "drop", "503"],
        default="refuse",
        help="how Compass is unavailable: connections refused (default), dropped, or HTTP 503",
    )
    parser.add_argument(
        "--real-director",
        action="store_true",
        help="the real Compass Director (PostgreSQL, our gateway as Hydra/Oathkeeper and a "
        "Connector for its tokens) instead of the simulator",
    )
    parser.add_argument(
        "--real-connector",
        action="store_true",
        help="with --real-director: the real Connector, hydrator and Oathkeeper take the "
        "runtimes' tokens instead of the gateway's Connector (needs root and unshare)",
    )
    parser.add_argument(
        "--real-runtime-agent",
        action="store_true",
        help="Kyma's real compass-runtime-agent in runtime B instead of the simulated one "
        "(needs root and unshare; reaches Synchronized over Compass's certificate-secured side)",
    )
    parser.add_argument(
        "--agent-pod",
        action="store_true",
        help="runtime A on a real node (kubelet, containerd), its agent a pod of make image's "
        "image; needs root and Debian's containerd, runc, CNI plugins and nftables "
        "(docs/real-node.md)",
    )
    parser.add_argument(
        "--klm",
        action="store_true",
        help="the real lifecycle-manager installs the agent module in runtime A, from make "
        "module's output in a local OCI registry, instead of the imitation (built by make klm)",
    )
    parser.add_argument(
        "--all-real",
        action="store_true",
        help="the whole real path: --real-director --real-connector --real-runtime-agent --klm "
        "--agent-pod",
    )
    parser.add_argument(
        "--timeout-scale",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="multiply every step's timeout (e.g. 3 on a slow machine)",
    )
    return parser


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _report_failure(story: Story, exc: StepFailed) -> None:
    story.failed(str(exc).splitlines()[0])
    for line in str(exc).splitlines()[1:]:
        story.detail(line)
    for path in exc.logs:
        story.detail(f"last lines of {path}:")
        for line in log_tail(path, 10).splitlines():
            story.detail(f"  {line}")


def _real_connector_refusal(real_director: bool) -> str | None:
    """Why --real-connector cannot work here, or None."""
    if not real_director:
        return "--real-connector needs --real-director: it exchanges the real Director's tokens"
    why = real_connector.why_not_here()
    if why is None:
        where, reason = real_connector.find_connector()
        why = None if where is not None else reason
    return None if why is None else f"--real-connector: {why}"


def preflight(args: argparse.Namespace) -> tuple[str | None, Path | None]:
    """(why an option cannot work here, or None; the real runtime agent's build folder).

    With --agent-pod, `args.agent_image` becomes the image's archive (built, or found cached).
    --all-real sets each option of the whole real path; a refusal then names it too."""
    if args.all_real:
        args.real_director = args.real_connector = args.real_runtime_agent = True
        args.klm = args.agent_pod = True
    why, folder = _preflight(args)
    if why is not None and args.all_real:
        why = f"--all-real: {why}"
    return why, folder


def _preflight(args: argparse.Namespace) -> tuple[str | None, Path | None]:
    if args.timeout_scale <= 0:
        return "--timeout-scale must be positive", None
    why = None
    if args.real_director:
        where, reason = find_compass_source()
        if where is None:
            why = f"--real-director needs the pinned Compass source: {reason}"
    if why is None and args.real_connector:
        why = _real_connector_refusal(args.real_director)
    if why is None and args.klm:
        why = real_klm.why_not_here()
    args.agent_image = None
    if why is None and args.agent_pod:  # last: it may build the image
        args.agent_image, why = agent_pod.prepare()
    if why is not None:
        return why, None
    folder = None
    if args.real_runtime_agent:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            return (
                "--real-runtime-agent needs root and unshare(1): outside a pod the real "
                "compass-runtime-agent runs in a private mount namespace holding a dummy "
                "in-cluster ServiceAccount token (devenv/runtime_agent)",
                None,
            )
        try:
            folder = runtime_agent.build()
        except runtime_agent.RuntimeAgentUnavailable as exc:
            return f"--real-runtime-agent: the real compass-runtime-agent: {exc.reason}", None
    return None, folder


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    refusal, runtime_agent_dir = preflight(args)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")  # ✓ and … on a terminal that cannot show them
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="kyma-compass-pull-demo-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # SIGINT explicitly too: a shell starts background jobs with it ignored, and Python keeps that.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)

    story = Story()
    story.say("kyma-compass-pull: local demo (pull-model connection of Kyma runtimes to Compass)")
    story.say(f"work folder (logs of every process): {workdir}")
    demo = Demo(
        Options(
            workdir=workdir,
            keep=args.keep,
            outage=args.outage,
            timeout_scale=args.timeout_scale,
            real_director=args.real_director,
            real_runtime_agent=args.real_runtime_agent,
            real_connector=args.real_connector,
            runtime_agent_dir=runtime_agent_dir,
            agent_image=args.agent_image,
            klm=args.klm,
        ),
        story,
    )
    code = 0
    try:
        demo.run()
        story.say()
        story.say(f"✓ every step happened; the demo took {story.elapsed():.1f}s")
        if args.keep:
            demo.print_access()
            demo.keep_running()
    except StepFailed as exc:
        _report_failure(story, exc)
        story.say(f"✗ the demo did not finish ({story.elapsed():.1f}s); logs: {workdir / 'logs'}")
        code = 1
    except KeyboardInterrupt:
        story.say()
        story.say("interrupted")
        code = 0 if demo.finished else 130  # with --keep, Ctrl-C is the normal end
    except Exception as exc:  # anything else: say what, keep the traceback in the work folder
        trace = workdir / "demo-error.log"
        trace.write_text(traceback.format_exc())
        story.failed(f"unexpected {type(exc).__name__}: {str(exc)[:300]} (traceback: {trace})")
        code = 1
    finally:
        # A second Ctrl-C must not leave half of the processes running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        story.say("stopping every process the demo started …")
        demo.close()
        story.say(f"✓ stopped; logs are in {workdir / 'logs'}")
    return code
