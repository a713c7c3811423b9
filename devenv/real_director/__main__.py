"""Command line: run the real Compass Director stack until SIGINT/SIGTERM.

Prints one JSON line with URLs and credentials on stdout once Director is ready (for scripts),
and the same, readable, on stderr. Everything it started is stopped on SIGINT/SIGTERM, also
while it is still starting.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from .affinity import parse_cpus
from .connector import ConnectorUnavailable
from .stack import CompassSourceMissing, RealCompassError, start_real_compass

EXIT_NO_SOURCE = 3


class _Stopped(BaseException):
    """Raised by the signal handler while the stack is still starting, so the start unwinds
    through its own clean-up."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.real_director",
        description="Run the real Compass Director (built once from the pinned source) with "
        "PostgreSQL, a test kube-apiserver and a gateway playing Hydra, Oathkeeper and the "
        "hydrator (OAuth client credentials -> signed JWT). Prints URLs and credentials, runs "
        "until SIGINT/SIGTERM, then stops everything it started.",
        epilog="The gateway's admin API: GET/DELETE <gateway>/_gateway/calls (Director calls "
        'per operation), PUT <gateway>/_gateway/faults {"operation": "registerRuntime", '
        '"ratio": 0.3, "count": null, "mode": "504"|"drop"} (lose answers after Director '
        "acted), DELETE <gateway>/_gateway/faults; PUT/DELETE <gateway>/_gateway/credentials "
        '{"status": 401} (refuse the client credentials, revoking its tokens) and '
        '<gateway>/_gateway/latency {"min": 0.1, "max": 0.5} (a slow Director). Source: '
        "COMPASS_SRC, else "
        "../shared/compass-src/ (exit 3 when absent; with --real-connector also when Oathkeeper "
        "cannot be had from the Go module proxy).",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="folder for logs, config and the cluster (default: a temporary one, removed at "
        "the end unless --keep-workdir)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temporary workdir")
    parser.add_argument(
        "--global-account",
        action="append",
        default=[],
        metavar="EXTERNAL_ID",
        help="add a global account (tenant type account); repeatable",
    )
    parser.add_argument(
        "--subaccount",
        action="append",
        default=[],
        metavar="EXTERNAL_ID:PARENT[:REGION]",
        help="add a subaccount of global account PARENT (added if missing), with an optional "
        "region label Director copies onto runtimes; repeatable",
    )
    parser.add_argument(
        "--connector-url",
        help="what Director returns as the one-time token's connectorURL "
        "(default: <gateway>/connector/graphql, the gateway's Connector for Director's tokens)",
    )
    parser.add_argument(
        "--credentials-file",
        type=Path,
        help="write compass-manager's credentials file (data: client_id, client_secret, "
        "tokens_endpoint) here, for BROKER_DIRECTOR_CREDENTIALS_FILE",
    )
    parser.add_argument(
        "--real-connector",
        action="store_true",
        help="also run the real Connector, hydrator and Oathkeeper (built once by "
        "build-connector.sh; needs root and unshare), with our front for the "
        "certificate-secured side; one-time tokens then name Oathkeeper's /connector/graphql",
    )
    parser.add_argument(
        "--cpus",
        type=parse_cpus,
        metavar="LIST",
        help="run PostgreSQL, Director and the gateway on these CPUs only (e.g. 0 or 0-1,3; "
        "default: wherever this command runs)",
    )
    return parser


def _subaccount(spec: str) -> tuple[str, str, str | None]:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"--subaccount {spec!r}: expected EXTERNAL_ID:PARENT[:REGION]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        subaccounts = [_subaccount(spec) for spec in args.subaccount]
    except ValueError as exc:
        parser.error(str(exc))

    stop = threading.Event()
    starting = True

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if starting:
            raise _Stopped

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)

    own_workdir = args.workdir is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="real-compass-"))
    stack = None
    try:
        try:
            stack = start_real_compass(
                workdir,
                connector_url=args.connector_url,
                cpus=args.cpus,
                real_connector=args.real_connector,
            )
            for external in args.global_account:
                stack.add_global_account(external)
            for external, parent, region in subaccounts:
                stack.add_global_account(parent)
                stack.add_subaccount(external, parent=parent, region=region)
            if args.credentials_file:
                stack.write_credentials_file(args.credentials_file)
            starting = False
        except _Stopped:
            print("real-director: stopped while starting", file=sys.stderr)
            return 0
        except CompassSourceMissing as exc:
            print(f"real-director: {exc}", file=sys.stderr)
            return EXIT_NO_SOURCE
        except ConnectorUnavailable as exc:
            print(f"real-director: {exc}", file=sys.stderr)
            return EXIT_NO_SOURCE if exc.source_missing else 1
        except RealCompassError as exc:
            print(f"real-director: {exc}", file=sys.stderr)
            return 1

        endpoints = stack.endpoints()
        if args.credentials_file:
            endpoints["credentials_file"] = str(args.credentials_file)
        endpoints["timings"] = {k: round(v, 2) for k, v in stack.timings.items()}
        print(json.dumps(endpoints), flush=True)
        width = max(len(k) for k in endpoints)
        lines = [f"  {k:<{width}}  {v}" for k, v in endpoints.items()]
        print(
            "real Compass Director ready (Ctrl-C or SIGTERM stops everything):\n"
            + "\n".join(lines),
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(1.0):
            if not stack.running:
                print(
                    f"real-director: a part of the stack died; see {stack.director_log} "
                    "and the other logs in the workdir",
                    file=sys.stderr,
                )
                return 1
        return 0
    finally:
        # A second signal during the stop must not cut it short.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if stack is not None:
            stack.stop()
        if own_workdir and not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        print("real-director: stopped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
