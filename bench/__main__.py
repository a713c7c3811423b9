"""`python -m bench` (`make bench`): runs the benchmarks of issue 10 and writes
docs/benchmarks.md, docs/benchmarks.json and the plots.

Starts a control-plane API server (devenv.clusters), a JWKS server for the simulated runtimes'
keys, runtime API servers when `tokenreview` is measured, and per run a fresh Compass simulator
and broker(s); prints progress on stderr; rewrites the report after every run, so an
interrupted run still leaves what it measured. Everything it starts listens on 127.0.0.1 and
is stopped on the way out. `--plan` prints the runs and the expected duration without running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.retry_policy import Jitter, RetryPolicy, next_delay
from bench import report as report_mod
from bench import slow
from bench.jsonout import to_json
from bench.keys import RuntimeKey, new_runtime_keys
from bench.plan import ALL_SCENARIOS, OTHER_SCENARIOS, describe, fleet_runs
from bench.procs import Child, python_child, run_until_stopped
from bench.profiling import profiled_run
from bench.progress import Progress
from bench.results import BenchReport, Machine, Plan
from bench.scenarios import Bench, BenchConfig, RuntimeClusters
from bench.stack import ApiServer

REPO_ROOT = Path(__file__).resolve().parent.parent
# Issue 10: C = 8, L = 100 ms, T = 60 s, N = 100 ... 5,000; the old L = 50 ms at N = 100, 300.
DEFAULT_SIZES = (100, 300, 1000, 5000)
DEFAULT_LATENCY = 0.1
LEGACY_LATENCY = 0.05
LEGACY_SIZES = (100, 300)
IDENTITY_SIZES = (1000,)
REPLICA_SIZES = (5000,)
QUICK_SIZES = (20,)
REPORT_NAME = "benchmarks.md"
JSON_NAME = "benchmarks.json"
PLOT_NAMES = {"cold": "benchmarks-cold.png", "outage": "benchmarks-outage.png"}
MEASURED_PATHS = ("control_plane_broker", "agent", "devenv/compass_sim")
FULL_RUN = "make bench  (= python -m bench, every default below)"


def _sizes(text: str) -> tuple[int, ...]:
    """Comma-separated fleet sizes; an empty string means none (that table is left out)."""
    try:
        sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text}") from exc
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError("fleet sizes must be positive")
    return sizes


def _latency_range(text: str) -> tuple[float, float]:
    """`MIN-MAX` seconds (or one number: exactly that)."""
    low, _, high = text.partition("-")
    try:
        pair = (float(low), float(high or low))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not MIN-MAX seconds: {text}") from exc
    if not 0 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"wants 0 <= MIN <= MAX: {text}")
    return pair


def _scenarios(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in chosen if s not in ALL_SCENARIOS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"scenarios are a subset of {','.join(ALL_SCENARIOS)}")
    return chosen


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fleet benchmarks of the pull model (issue 10): cold start and Director "
        "outage per fleet size, a second Director latency, both identity modes, two broker "
        "replicas, steady state and the agent's footprint, against real broker processes, the "
        "Compass simulator and real API servers. Writes docs/benchmarks.md, "
        "docs/benchmarks.json and docs/benchmarks-{cold,outage}.png.",
        epilog=f"""The full run of issue 10 is the default:
  {FULL_RUN}
  python -m bench --profile     the same, and a repeat of the largest cold start under py-spy
Each run may take max(10x bound, 300 s), capped by --max-run-seconds: `python -m bench
--plan` prints every run with its bound and deadline, and the expected duration when
every run meets its target and when every run reaches its deadline.
Small checks while developing: `python -m bench --quick` (N = 20, a few minutes), or
e.g. `--sizes 100 --scenarios cold,outage`.""",
    )
    add = parser.add_argument
    add(
        "--sizes",
        "-n",
        type=_sizes,
        default=DEFAULT_SIZES,
        help="fleet sizes N of the primary cold start and outage (default 100,300,1000,5000)",
    )
    add(
        "--capacity",
        "-c",
        type=int,
        default=8,
        help="Director capacity C: concurrent calls served (default 8)",
    )
    add(
        "--broker-concurrency",
        type=int,
        default=None,
        help="the brokers' BROKER_DIRECTOR_MAX_CONCURRENCY (default C + C/4, at least C + 1: "
        "a call also spends time in transit outside Director's service, and with exactly C "
        "in flight Director's slots idle for that share)",
    )
    add(
        "--latency",
        "-l",
        type=float,
        default=DEFAULT_LATENCY,
        help="Director latency L per call of the primary configuration, s (default 0.1)",
    )
    add("--outage", "-t", type=float, default=60.0, help="outage length T, s (default 60)")
    add(
        "--legacy-latency",
        type=float,
        default=LEGACY_LATENCY,
        help="Director latency of the second table, s (default 0.05)",
    )
    add(
        "--legacy-sizes",
        type=_sizes,
        default=LEGACY_SIZES,
        help="fleet sizes of the second table (default 100,300; empty: none)",
    )
    add(
        "--identity-sizes",
        type=_sizes,
        default=IDENTITY_SIZES,
        help="cold start in jwks and tokenreview mode at these sizes (default 1000)",
    )
    add(
        "--tokenreview-clusters",
        type=int,
        default=3,
        help="runtime API servers the tokenreview fleet shares (default 3)",
    )
    add(
        "--replica-sizes",
        type=_sizes,
        default=REPLICA_SIZES,
        help="cold start with one and with --replicas brokers at these sizes (default 5000)",
    )
    add("--replicas", type=int, default=2, help="broker replicas of that run (default 2)")
    add(
        "--down-mode",
        choices=["503", "refuse", "drop"],
        default="503",
        help="how Director is down (simulator fault `down`; default 503)",
    )
    add(
        "--scenarios",
        type=_scenarios,
        default=ALL_SCENARIOS,
        help=f"subset to run, comma-separated (default {','.join(ALL_SCENARIOS)})",
    )
    add(
        "--steady-runtimes",
        type=int,
        default=400,
        help="registered runtimes in the steady-state scenario (default 400)",
    )
    add("--callers", type=int, default=200, help="concurrent callers in steady state (200)")
    add(
        "--report-runtimes",
        type=int,
        default=5000,
        help="registered runtimes sending connection reports in the reports scenario (5000)",
    )
    add(
        "--report-heartbeat",
        type=float,
        default=300.0,
        help="the agents' report heartbeat the reports scenario plays, s (300)",
    )
    add(
        "--report-window",
        type=float,
        default=60.0,
        help="how long the reports scenario measures, s (60)",
    )
    add("--idle", type=float, default=60.0, help="agent idle time in the footprint, s (60)")
    add(
        "--slow-n",
        type=int,
        default=slow.DEFAULT_N,
        help=f"runtimes of the slow-Director cold start (default {slow.DEFAULT_N})",
    )
    add(
        "--slow-latency",
        type=_latency_range,
        default=slow.DEFAULT_LATENCY,
        metavar="MIN-MAX",
        help="seconds each Director call takes in the slow-Director scenario, uniformly "
        "(default 3-5); `--scenarios slow` alone rewrites only its section of the report",
    )
    add(
        "--fleet-processes",
        type=int,
        default=1,
        help="processes the simulated agents run in (default 1; their CPU is reported)",
    )
    add(
        "--max-run-seconds",
        type=float,
        default=1800.0,
        help="cap of one fleet run's deadline max(10x bound, 300 s); agents still waiting "
        "then count as not connected (default 1800)",
    )
    add(
        "--broker-env",
        action="append",
        default=[],
        metavar="BROKER_X=VALUE",
        help="extra broker setting for every run (repeatable); shown in the report",
    )
    add(
        "--profile",
        action="store_true",
        help="repeat the largest primary cold start at the end with py-spy sampling its broker "
        "(--nonblocking; cProfile only if py-spy cannot attach, or BENCH_PROFILER=cprofile) "
        "and summarise the top frames in the report; no table figure comes from that repeat",
    )
    add(
        "--quick",
        action="store_true",
        help=f"small and short: N={','.join(map(str, QUICK_SIZES))} everywhere, T=10 s, 60 "
        "steady runtimes, 5 s idle; writes to a temporary folder unless --out-dir is given",
    )
    add("--plan", action="store_true", help="print the runs and expected duration, run nothing")
    add(
        "--out-dir",
        type=Path,
        default=None,
        help="where benchmarks.md, benchmarks.json and the plots go (default docs/)",
    )
    add(
        "--keep-workdir",
        action="store_true",
        help="keep logs and data of the run (broker logs, py-spy's raw stacks) for debugging",
    )
    return parser


def broker_concurrency_for(capacity: int) -> int:
    """Calls in flight that keep Director's `capacity` busy: measured, a call's round trip
    outside Director's service (request and answer in transit, both event loops' turns) was
    15 ms of 115 ms, and with exactly C in flight Director served 77 % of what it could."""
    return capacity + max(1, capacity // 4)


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(
        capacity=args.capacity,
        broker_concurrency=args.broker_concurrency or broker_concurrency_for(args.capacity),
        latency=args.latency,
        outage_seconds=args.outage,
        sizes=args.sizes,
        legacy_latency=args.legacy_latency,
        legacy_sizes=args.legacy_sizes,
        identity_sizes=args.identity_sizes,
        tokenreview_clusters=args.tokenreview_clusters,
        replica_sizes=args.replica_sizes,
        replicas=args.replicas,
        steady_runtimes=args.steady_runtimes,
        steady_callers=args.callers,
        report_runtimes=args.report_runtimes,
        report_heartbeat=args.report_heartbeat,
        report_window=args.report_window,
        fleet_processes=args.fleet_processes,
        max_run_seconds=args.max_run_seconds,
        scenarios=args.scenarios,
    )


def machine(load: tuple[float, float, float] | None = None) -> Machine:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Machine(
        cpus=os.cpu_count() or 0,
        cpu_model=model,
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        load_before=load or os.getloadavg(),
    )


def revision() -> tuple[str, list[str]]:
    """The commit measured, and which measured parts differed from it when the run started
    (each broker and agent process loads the working tree as it is when it starts)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *MEASURED_PATHS],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "", []
    return commit, sorted({line[3:].split("/", 1)[0] for line in dirty if len(line) > 3})


def raise_open_files_limit(needed: int) -> str | None:
    """Lifts this process's soft limit of open files to the hard one (the broker and fleet
    processes inherit it: each holds one connection per agent); a note when that is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < needed:
        return (
            f"The limit of open files was {hard:,}, below the {needed:,} a broker needs with one "
            "connection per agent of the largest fleet: connections beyond it failed (transport "
            "errors) because of the machine, not the broker."
        )
    return None


def retry_policy_note() -> str | None:
    """Checks at run time that the imported retry policy obeys a server's Retry-After."""
    policy = RetryPolicy(jitter=Jitter.NONE)
    if next_delay(policy, 1, retry_after=30.0) < 30.0:
        return (
            "agent/retry_policy.py, as imported for this run, did NOT honour `Retry-After` "
            "(next_delay(attempt 1, Retry-After 30 s) < 30 s): the simulated agents came back "
            "sooner than the broker asked."
        )
    return None


def start_jwks(keys: Sequence[RuntimeKey], workdir: Path) -> tuple[Child, str]:
    keys_file = workdir / "jwks.json"
    keys_file.write_text(json.dumps({k.runtime_id: [k.public_jwk()] for k in keys}))
    child = python_child(
        "jwks-server",
        "bench.jwks_server",
        str(keys_file),
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        log_path=workdir / "jwks.log",
        capture_stdout=True,
    )
    port = int(child.first_stdout_json(timeout=30)["port"])
    return child, f"http://127.0.0.1:{port}/rt/{{runtime_id}}"


def keep_real_director(
    out_dir: Path, text: str, data: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The report and JSON with the figures `python -m bench.real --docs` left in `out_dir`
    (its own section and key), which this run does not measure, carried over."""
    from bench import real  # noqa: PLC0415

    try:
        old_text = (out_dir / REPORT_NAME).read_text()
        old_data = json.loads((out_dir / JSON_NAME).read_text())
    except (OSError, ValueError):
        return text, data
    if real.SECTION_BEGIN in old_text and real.SECTION_END in old_text:
        section = old_text.partition(real.SECTION_BEGIN)[2].partition(real.SECTION_END)[0]
        text = real.merge_section(text, section)
    if isinstance(old_data, dict) and real.JSON_KEY in old_data:
        data = {**data, real.JSON_KEY: old_data[real.JSON_KEY]}
    return text, data


def keep_slow(
    out_dir: Path, text: str, data: dict[str, Any], runs: Sequence[slow.SlowRun]
) -> tuple[str, dict[str, Any]]:
    """The report and JSON with the slow-Director section: this run's rows, and the rows of
    the targets it did not measure as the files in `out_dir` had them."""
    try:
        old = slow.from_json(json.loads((out_dir / JSON_NAME).read_text()).get(slow.JSON_KEY))
    except (OSError, ValueError, AttributeError):
        old = []
    merged = slow.merged_runs(old, runs)
    if not merged:
        return text, data
    data = {**data, slow.JSON_KEY: slow.to_json(merged)}
    return slow.merge_section(text, slow.render(merged)), data


def write_report(
    report: BenchReport,
    out_dir: Path,
    progress: Progress,
    slow_runs: Sequence[slow.SlowRun] = (),
    *,
    only_slow: bool = False,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if only_slow:  # its own section only: everything else stays as the last full run left it
        slow.merge_docs(out_dir, slow_runs, report=REPORT_NAME, data_file=JSON_NAME)
        progress.say(f"wrote the slow-Director section of {out_dir / REPORT_NAME} and {JSON_NAME}")
        return
    from bench.plot import plot_connected  # noqa: PLC0415 (matplotlib only when writing)

    for scenario, name in PLOT_NAMES.items():
        runs = report_mod.plotted_runs(report, scenario)
        if runs:
            plot_connected(runs, out_dir / name)
            report.plots[scenario] = name
    text, data = report_mod.render(report), to_json(report)
    text, data = keep_real_director(out_dir, text, data)
    text, data = keep_slow(out_dir, text, data, slow_runs)
    (out_dir / REPORT_NAME).write_text(text)
    (out_dir / JSON_NAME).write_text(json.dumps(data, indent=1) + "\n")
    progress.say(f"wrote {out_dir / REPORT_NAME} and {JSON_NAME}")


async def start_runtime_clusters(
    count: int, binaries: Any, workdir: Path, progress: Progress
) -> tuple[list[Any], RuntimeClusters]:
    from devenv.clusters import start_cluster  # noqa: PLC0415

    progress.say(f"tokenreview: starting {count} runtime API servers")
    clusters: list[Any] = []
    try:
        for i in range(count):
            clusters.append(
                await asyncio.to_thread(
                    start_cluster, f"bench-rt{i}", binaries, workdir=workdir / f"rt{i}"
                )
            )
    except BaseException:
        for cluster in clusters:
            cluster.stop()
        raise
    return clusters, RuntimeClusters(
        servers=[
            ApiServer(c.kubeconfig_path, workdir / f"rt{i}-client") for i, c in enumerate(clusters)
        ],
        kubeconfigs=[c.kubeconfig_path.read_text() for c in clusters],
    )


async def run_all(args: argparse.Namespace, out_dir: Path, workdir: Path) -> BenchReport:
    from devenv.clusters import find_binaries, kyma_crds, start_cluster  # noqa: PLC0415

    progress = Progress()
    started = time.monotonic()
    load_before = os.getloadavg()
    broker_env = dict(item.split("=", 1) for item in args.broker_env)
    plan = plan_from(args)
    config = BenchConfig(
        plan=plan,
        down_mode=args.down_mode,
        idle_seconds=args.idle,
        workdir=workdir,
        broker_env=broker_env,
    )
    runs = fleet_runs(plan, args.scenarios, profile=args.profile)
    commit, uncommitted = revision()
    report = BenchReport(
        command=report_mod.recorded_command("python -m bench", sys.argv[1:]),
        machine=machine(load_before),
        plan=plan,
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        commit=commit,
        uncommitted=uncommitted,
    )
    note = retry_policy_note()
    slow_runs: list[slow.SlowRun] = []
    only_slow = set(args.scenarios) == {"slow"}
    largest = max([*(r.n for r in runs), plan.steady_callers, args.slow_n, 1])
    limit_note = raise_open_files_limit(largest + 1024)

    def save() -> None:
        report.duration_seconds = time.monotonic() - started
        report.machine = replace(report.machine, load_after=os.getloadavg())
        report.notes = [
            *report_mod.static_notes(broker_env),
            *([note] if note else []),
            *([limit_note] if limit_note else []),
            *report_mod.findings(report),
        ]
        write_report(report, out_dir, progress, slow_runs, only_slow=only_slow)

    progress.say("starting the control-plane API server")
    binaries = await asyncio.to_thread(find_binaries)
    kcp_cluster = await asyncio.to_thread(
        start_cluster, "bench-kcp", binaries, workdir=workdir / "kcp"
    )
    runtime_clusters: list[Any] = []
    footprint_cluster = None
    jwks: Child | None = None
    try:
        crds = [*kyma_crds(), *sorted((REPO_ROOT / "charts/compass-broker/crds").glob("*.yaml"))]
        await asyncio.to_thread(kcp_cluster.apply_crds, crds)
        needed = max(
            [*(r.n for r in runs), plan.steady_runtimes, plan.report_runtimes, args.slow_n, 1]
        )
        progress.say(f"generating {needed} runtime signing keys")
        keys = new_runtime_keys(needed)
        jwks, template = start_jwks(keys, workdir)
        bench = Bench(
            config,
            kcp=ApiServer(kcp_cluster.kubeconfig_path, workdir / "kcp-client"),
            keys=keys,
            jwks_template=template,
            progress=progress,
        )
        if "footprint" in args.scenarios:
            progress.say("footprint: starting a runtime API server")
            footprint_cluster = await asyncio.to_thread(
                start_cluster, "bench-runtime", binaries, workdir=workdir / "runtime"
            )
            await asyncio.to_thread(footprint_cluster.apply_crds, kyma_crds())
            report.footprint = await bench.footprint(footprint_cluster)
            footprint_cluster.stop()
            footprint_cluster = None
            save()
        if "steady" in args.scenarios:
            report.steady = await bench.steady()
            save()
        if "reports" in args.scenarios:
            report.reports = await bench.reports()
            save()
        if "slow" in args.scenarios:
            slow_runs.append(
                await bench.slow_director(
                    n=args.slow_n,
                    latency=args.slow_latency,
                    commit=report.commit,
                    note=(
                        f"measured with uncommitted changes in {', '.join(report.uncommitted)}"
                        if report.uncommitted
                        else ""
                    ),
                )
            )
            save()
        for spec in runs:
            if spec.identity_mode == "tokenreview" and bench.runtime_clusters is None:
                runtime_clusters, bench.runtime_clusters = await start_runtime_clusters(
                    plan.tokenreview_clusters, binaries, workdir, progress
                )
            result = await bench.fleet_run(spec)
            if spec.profile:
                report.profile = bench.profile and profiled_run(bench.profile, result)
            else:
                report.runs.append(result)
            if spec.identity_mode == "tokenreview" and not any(
                r.identity_mode == "tokenreview" for r in runs[runs.index(spec) + 1 :]
            ):
                for cluster in runtime_clusters:  # their memory is free for the next runs
                    cluster.stop()
                runtime_clusters, bench.runtime_clusters = [], None
            save()
    finally:
        if footprint_cluster is not None:
            footprint_cluster.stop()
        for cluster in runtime_clusters:
            cluster.stop()
        if jwks is not None:
            jwks.stop()
        kcp_cluster.stop()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        explicit = set(sys.argv[1:] if argv is None else argv)
        defaults = {
            ("--sizes", "-n"): ("sizes", QUICK_SIZES),
            ("--legacy-sizes",): ("legacy_sizes", QUICK_SIZES),
            ("--identity-sizes",): ("identity_sizes", QUICK_SIZES),
            ("--replica-sizes",): ("replica_sizes", QUICK_SIZES),
            ("--outage", "-t"): ("outage", 10.0),
            ("--steady-runtimes",): ("steady_runtimes", 60),
            ("--report-runtimes",): ("report_runtimes", 200),
            ("--report-window",): ("report_window", 10.0),
            ("--idle",): ("idle", 5.0),
            ("--slow-n",): ("slow_n", QUICK_SIZES[0]),
        }
        for flags, (name, value) in defaults.items():
            if not explicit & set(flags):
                setattr(args, name, value)
    for item in args.broker_env:
        if "=" not in item or not item.startswith("BROKER_"):
            build_parser().error(f"--broker-env wants BROKER_X=VALUE, got {item!r}")
    if args.plan:
        plan = plan_from(args)
        runs = fleet_runs(plan, args.scenarios, profile=args.profile)
        other = tuple(s for s in args.scenarios if s in OTHER_SCENARIOS)
        print("\n".join(describe(plan, runs, other=other)))
        return 0
    if args.out_dir is not None:
        out_dir = args.out_dir
    elif args.quick:
        out_dir = Path(tempfile.mkdtemp(prefix="bench-quick-out-"))
    else:
        out_dir = REPO_ROOT / "docs"
    workdir = Path(tempfile.mkdtemp(prefix="bench-run-"))
    try:
        if not run_until_stopped(run_all(args, out_dir, workdir)):
            return 130
    finally:
        if args.keep_workdir:
            print(f"work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"report: {out_dir / REPORT_NAME}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
