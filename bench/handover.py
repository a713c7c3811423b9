"""`python -m bench.handover`: issue 27's measurement of the hand-over to Kyma's real
compass-runtime-agent — Director `requestOneTimeTokenForRuntime` calls per reconnect, and the
time from a failure to `Synchronized`.

One runtime API server, the Compass simulator with its certificate-secured side, a broker that
costs one Director one-time token per token request, our agent with its shipped defaults
(in-process), and the real compass-runtime-agent (application-connector-manager 859cac3,
`devenv/runtime_agent`) with the module's environment: `--sync-period` (default the module's
180 s) and `--minimal-sync` (15 s). The module is enabled and the runtime connects once; then
each reconnect deletes the CompassConnection: the real agent starts over with the token it
already spent, fails (`ConnectionFailed`), our agent pulls a fresh token and hands it over, the
real agent connects and, at its next reconcile, synchronises with Director over mTLS. Per
reconnect: the one-time tokens issued, and the seconds from `ConnectionFailed` to the
CompassConnection's `Connected`, to its `Synchronized` and to our agent's report of
`Synchronized` reaching the broker.

Needs root, unshare(1) and the runtime agent's source (as `make runtime-agent`); holds the
machine-wide runtime-agent lock (port 8080) for the whole run. Takes about
`2 x period + reconnects x (16 s + up to a period)`: about 30 min for 10 reconnects at 180 s.
Progress goes to stderr; `--out` gets the JSON; `--docs` writes the section
"One token per reconnect (real compass-runtime-agent)" of docs/benchmarks.md (nothing else).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.progress import Progress
from bench.report import FINDINGS_RECORD
from devenv import runtime_agent
from devenv.clusters import find_binaries, kyma_crds, start_cluster
from devenv.runtime_agent.landscape import Handover

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs" / "benchmarks.md"
SECTION = "## One token per reconnect (real compass-runtime-agent)"


@dataclass
class Reconnect:
    index: int
    tokens: int
    failed_to_connected: float | None
    failed_to_synchronized: float | None
    failed_to_reported: float | None


@dataclass
class HandoverResult:
    commit: str
    started: str
    sync_period: float
    minimal_sync: float
    first_connection_tokens: int = 0
    first_connected: float | None = None
    first_synchronized: float | None = None
    reconnects: list[Reconnect] = field(default_factory=list)
    wall_seconds: float = 0.0
    complete: bool = False
    random_phase: bool = False  # failures at a random point of the resync cycle

    @property
    def tokens_per_reconnect(self) -> float | None:
        if not self.reconnects:
            return None
        return sum(r.tokens for r in self.reconnects) / len(self.reconnects)


def spread(values: Sequence[float | None]) -> str:
    """ "median m s (min a - max b)" of the values measured, or "-"."""
    have = [v for v in values if v is not None]
    if not have:
        return "-"
    return (
        f"median {statistics.median(have):.0f} s (min {min(have):.0f} - max {max(have):.0f} s, "
        f"n = {len(have)})"
    )


def render_section(result: HandoverResult, command: str) -> str:
    """The docs section, from its heading to its last line (ends with a newline)."""
    per = result.tokens_per_reconnect
    n = len(result.reconnects)
    lines = [
        SECTION,
        "",
        "Issue 27: 1.00 Director tokens per reconnect with the real compass-runtime-agent "
        "(application-connector-manager 859cac3), ≥ 10 reconnects; time to `Synchronized`.",
        "",
        f"Commit `{result.commit}` ({result.started}), sync period {result.sync_period:g} s "
        f"(`APP_CONTROLLER_SYNC_PERIOD`), minimal sync time {result.minimal_sync:g} s, our agent's "
        "defaults; "
        + ("complete" if result.complete else "**interrupted: partial figures**")
        + f", {result.wall_seconds / 60:.0f} min on 2 shared cores. A reconnect: the "
        "CompassConnection deleted, the real agent fails (`ConnectionFailed`), ours pulls a "
        "token and hands it over. "
        + (
            "Failures after a random wait of up to one period, anywhere in the real agent's "
            "resync cycle."
            if result.random_phase
            else "Failures right after the previous `Synchronized`: the worst case for "
            "`Synchronized` (`--random-phase` puts them anywhere in the cycle)."
        ),
        "",
        "| | figure |",
        "|---|---|",
        f"| reconnects | {n} |",
        f"| Director one-time tokens per reconnect | "
        f"{'-' if per is None else f'**{per:.2f}**'} "
        f"({sum(r.tokens for r in result.reconnects)} for {n}) |",
        f"| failure → `Connected` | {spread([r.failed_to_connected for r in result.reconnects])} |",
        "| failure → `Synchronized` (CompassConnection) | "
        f"{spread([r.failed_to_synchronized for r in result.reconnects])} |",
        "| failure → `Synchronized` reported to the broker | "
        f"{spread([r.failed_to_reported for r in result.reconnects])} |",
        f"| first connection: tokens, module enabled → `Connected` / `Synchronized` | "
        f"{result.first_connection_tokens}, "
        f"{_seconds(result.first_connected)} / {_seconds(result.first_synchronized)} |",
        "",
        "Per reconnect (Director tokens; seconds from `ConnectionFailed` to `Connected` / "
        "`Synchronized` / reported): "
        + "; ".join(
            f"{r.index}: {r.tokens}, {_bare(r.failed_to_connected)}/"
            f"{_bare(r.failed_to_synchronized)}/{_bare(r.failed_to_reported)}"
            for r in result.reconnects
        )
        + ".",
        "",
        f"Why the times are what they are: [0016](design/{FINDINGS_RECORD}).",
        "",
        f"Reproduce: `{command}` (root, unshare(1), the runtime agent's source).",
    ]
    return "\n".join(_wrap(line) for line in lines) + "\n"


def _wrap(paragraph: str, width: int = 100) -> str:
    """Prose wrapped as the docs are; headings and table rows as they are."""
    if paragraph.startswith(("#", "|")) or len(paragraph) <= width:
        return paragraph
    return textwrap.fill(paragraph, width, break_long_words=False, break_on_hyphens=False)


def _bare(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def replace_section(document: str, section: str) -> str:
    """`document` with its section under SECTION replaced by `section` (appended when absent);
    the section runs to the next `## ` heading, the next section's begin marker (`<!-- `, of
    the sections other generators own) or the end."""
    lines = document.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        return document.rstrip("\n") + "\n\n" + section
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "<!-- "))),
        len(lines),
    )
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head


async def _until(
    condition: Callable[[], object], *, within: float, what: str, poll: float = 0.5
) -> float:
    """Waits for `condition()` to be truthy; returns time.monotonic() when it was."""
    deadline = time.monotonic() + within
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:g} s")
        await asyncio.sleep(poll)


async def measure(args: argparse.Namespace, result: HandoverResult, progress: Progress) -> None:
    binary_dir = runtime_agent.build()
    workdir = Path(tempfile.mkdtemp(prefix="bench-handover-"))
    progress.say(f"work folder {workdir}; starting a runtime API server")
    cluster = start_cluster("handover", find_binaries(), workdir=workdir / "cluster")
    period = args.sync_period
    # Worst case for Synchronized: the first resync comes about two periods after start.
    synced_within = 2 * 1.1 * period + 60
    try:
        cluster.apply_crds(kyma_crds())
        real = runtime_agent.RealRuntimeAgent(
            cluster,
            binary_dir,
            workdir / "runtime-agent",
            sync_period=period,
            minimal_sync=args.minimal_sync,
        )
        async with Handover(cluster, workdir / "agent", runtime_id="kyma-bench-handover") as h:
            progress.say("waiting for the runtime-agent lock (port 8080), then starting it")
            real.start()
            try:
                await _until(
                    lambda: h.state() == "ConnectionFailed", within=120, what="no secret yet"
                )
                progress.say("real agent up (ConnectionFailed: no secret yet); enabling the module")
                enabled = time.monotonic()
                h.enable_module()
                connected = await _until(
                    lambda: h.state() in ("Connected", "Synchronized"),
                    within=synced_within,
                    what="first Connected",
                )
                result.first_connected = connected - enabled
                synced = await _until(
                    lambda: h.state() == "Synchronized", within=synced_within, what="Synchronized"
                )
                result.first_synchronized = synced - enabled
                result.first_connection_tokens = h.tokens_issued()
                progress.say(
                    f"first connection: {result.first_connection_tokens} token(s), Connected "
                    f"after {result.first_connected:.0f} s, Synchronized after "
                    f"{result.first_synchronized:.0f} s"
                )
                for index in range(1, args.reconnects + 1):
                    if args.random_phase:
                        await asyncio.sleep(random.uniform(0, period))
                    before = h.tokens_issued()
                    h.delete_connection()
                    failed = await _until(
                        lambda: h.state() == "ConnectionFailed", within=60, what="spent token"
                    )
                    connected = await _until(
                        lambda: h.state() in ("Connected", "Synchronized"),
                        within=synced_within,
                        what=f"reconnect {index}: Connected",
                    )
                    synced = await _until(
                        lambda: h.state() == "Synchronized",
                        within=synced_within,
                        what=f"reconnect {index}: Synchronized",
                    )
                    reported = await _until(
                        partial(h.first_report, "Synchronized", failed),
                        within=60,
                        what=f"reconnect {index}: Synchronized reported",
                    )
                    report_at = h.first_report("Synchronized", failed) or reported
                    # A late token would land in the next reconnect: count once settled.
                    await asyncio.sleep(2)
                    entry = Reconnect(
                        index=index,
                        tokens=h.tokens_issued() - before,
                        failed_to_connected=connected - failed,
                        failed_to_synchronized=synced - failed,
                        failed_to_reported=report_at - failed,
                    )
                    result.reconnects.append(entry)
                    progress.say(
                        f"reconnect {index}/{args.reconnects}: {entry.tokens} token(s); "
                        f"Connected +{entry.failed_to_connected:.0f} s, Synchronized "
                        f"+{entry.failed_to_synchronized:.0f} s, reported "
                        f"+{entry.failed_to_reported:.0f} s; running mean "
                        f"{result.tokens_per_reconnect:.2f} tokens/reconnect"
                    )
                    write_outputs(args, result)
                if not real.running:
                    raise RuntimeError("the real agent exited:\n" + real.log_tail())
                result.complete = True
            finally:
                real.stop()
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def write_outputs(args: argparse.Namespace, result: HandoverResult) -> None:
    data = asdict(result)
    data["tokens_per_reconnect"] = result.tokens_per_reconnect
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    if args.docs:
        DOCS.write_text(
            replace_section(DOCS.read_text(), render_section(result, reproduce(result)))
        )


def reproduce(result: HandoverResult) -> str:
    """The command that measures `result` again."""
    return (
        f"python -m bench.handover --reconnects {max(len(result.reconnects), 1)} "
        f"--sync-period {result.sync_period:g} --minimal-sync {result.minimal_sync:g}"
        + (" --random-phase" if result.random_phase else "")
        + " --docs"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.handover",
        description="Director one-time tokens per reconnect and the time from failure to "
        "Synchronized, with Kyma's real compass-runtime-agent reading our agent's Secret "
        "(issue 27). Takes about 2 x period + reconnects x (16 s + up to a period).",
    )
    parser.add_argument("--reconnects", type=int, default=10, help="reconnects (default 10)")
    parser.add_argument(
        "--sync-period",
        type=float,
        default=180.0,
        help="the real agent's APP_CONTROLLER_SYNC_PERIOD in seconds (default: the module's 180)",
    )
    parser.add_argument(
        "--minimal-sync",
        type=float,
        default=15.0,
        help="its APP_MINIMAL_COMPASS_SYNC_TIME in seconds (default: the module's 15)",
    )
    parser.add_argument(
        "--random-phase",
        action="store_true",
        help="before each failure wait a random time up to one period, so failures fall "
        "anywhere in the real agent's resync cycle (default: right after the previous "
        "Synchronized, the worst case for the time to Synchronized)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results/handover.json"),
        help="the figures as JSON (rewritten after every reconnect)",
    )
    parser.add_argument(
        "--docs",
        action="store_true",
        help="write the figures into their section of docs/benchmarks.md (after each reconnect)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: write the docs section from the JSON of an earlier run",
    )
    return parser


def result_from_json(data: dict[str, Any]) -> HandoverResult:
    fields = {k: v for k, v in data.items() if k in HandoverResult.__dataclass_fields__}
    fields["reconnects"] = [Reconnect(**r) for r in data.get("reconnects", [])]
    return HandoverResult(**fields)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.reconnects < 1 or args.sync_period <= 0 or args.minimal_sync <= 0:
        print("reconnects, --sync-period and --minimal-sync must be positive", file=sys.stderr)
        return 2
    if args.from_json is not None:
        saved = result_from_json(json.loads(args.from_json.read_text()))
        DOCS.write_text(replace_section(DOCS.read_text(), render_section(saved, reproduce(saved))))
        return 0
    progress = Progress()
    result = HandoverResult(
        commit=commit(),
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        sync_period=args.sync_period,
        minimal_sync=args.minimal_sync,
        random_phase=args.random_phase,
    )
    began = time.monotonic()
    code = 0
    try:
        asyncio.run(measure(args, result, progress))
    except KeyboardInterrupt:
        progress.say("interrupted")
        code = 130
    except Exception as exc:  # the partial figures are still written
        progress.say(f"failed: {type(exc).__name__}: {exc}")
        code = 1
    result.wall_seconds = time.monotonic() - began
    write_outputs(args, result)
    per = result.tokens_per_reconnect
    progress.say(
        f"done: {len(result.reconnects)} reconnects, "
        f"{'-' if per is None else f'{per:.2f}'} tokens per reconnect; figures in {args.out}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
