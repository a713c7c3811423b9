"""Command line: run the Compass simulator until SIGINT/SIGTERM.

Prints one JSON line with the URLs on stdout when listening (handy with --port 0);
logs go to stderr. The client secret may also come from COMPASS_SIM_CLIENT_SECRET,
which keeps it out of the process list.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import ConsumerType, GlobalAccount, SimConfig, Subaccount
from .errors import ErrorCode
from .faults import DownMode, Faults, InjectedError, Latency, LostResponseMode, RateLimit
from .server import CompassSimulator

SECRET_ENV = "COMPASS_SIM_CLIENT_SECRET"  # noqa: S105 - a variable name, not a secret


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.compass_sim",
        description="Compass simulator: OAuth token endpoint, Director and Connector "
        "GraphQL APIs, with fault injection (admin API under /_sim/).",
    )
    net = parser.add_argument_group("listening")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    net.add_argument("--port", type=int, default=0, help="main port (default 0: a free one)")
    net.add_argument(
        "--admin-port", type=int, default=0, help="admin-only port (default 0: a free one)"
    )
    net.add_argument(
        "--public-url", help="base URL clients reach the simulator at (in tokens and config)"
    )

    auth = parser.add_argument_group("clients and tenants")
    auth.add_argument("--client-id", required=True, help="OAuth client ID")
    auth.add_argument(
        "--client-secret", help=f"OAuth client secret (or environment variable {SECRET_ENV})"
    )
    auth.add_argument(
        "--tenant",
        action="append",
        default=None,
        help="a global account Director knows (repeatable); without --tenant and "
        "--subaccount every tenant is accepted and new subaccounts join their first caller",
    )
    auth.add_argument(
        "--subaccount",
        action="append",
        default=[],
        metavar="GLOBAL_ACCOUNT:SUBACCOUNT[:REGION]",
        help="a subaccount Director knows, with its region label (repeatable)",
    )
    auth.add_argument(
        "--consumer-type",
        choices=[c.value for c in ConsumerType],
        default=ConsumerType.INTEGRATION_SYSTEM.value,
        help="how the caller is presented to Director; an Integration System's runtimes "
        "get labels runtimeType and region (default: %(default)s)",
    )

    ttl = parser.add_argument_group("lifetimes and limits")
    ttl.add_argument("--access-token-ttl", type=float, default=3600.0, help="seconds")
    ttl.add_argument("--ott-ttl", type=float, default=3600.0, help="one-time token, seconds")
    ttl.add_argument("--csr-token-ttl", type=float, default=300.0, help="seconds")
    ttl.add_argument("--max-page-size", type=int, default=200, help="runtimes(first:) limit")

    state = parser.add_argument_group("state")
    state.add_argument("--state-file", type=Path, help="load runtimes from and save them to")

    faults = parser.add_argument_group("initial faults (change later with PUT /_sim/faults)")
    faults.add_argument("--down", choices=[m.value for m in DownMode])
    faults.add_argument("--down-retry-after", type=int, help="Retry-After seconds with --down 503")
    faults.add_argument("--latency", type=float, default=0.0, help="fixed delay, seconds")
    faults.add_argument("--jitter", type=float, default=0.0, help="random extra delay, seconds")
    faults.add_argument(
        "--error",
        action="append",
        default=[],
        metavar="OPERATION:CODE[:RATE]",
        help="inject Director error CODE into OPERATION ('*' = all) with probability RATE",
    )
    faults.add_argument(
        "--lost-response",
        action="append",
        default=[],
        metavar="OPERATION[:COUNT]",
        help="the next COUNT (default 1) successful calls lose their response",
    )
    faults.add_argument(
        "--lost-response-mode", choices=[m.value for m in LostResponseMode], default="504"
    )
    faults.add_argument(
        "--commit-then-error",
        action="append",
        default=[],
        metavar="MUTATION[:COUNT]",
        help="the next COUNT (default 1) successful calls take effect, then answer code 10",
    )
    faults.add_argument(
        "--field-error-after-commit",
        action="append",
        default=[],
        metavar="OPERATION[:COUNT]",
        help="the next COUNT (default 1) answered Runtimes have labels null and a code-10 error",
    )
    faults.add_argument(
        "--database-down",
        action="store_true",
        help="Director's database is gone: every Director call fails (codes 10 / 26)",
    )
    faults.add_argument("--rate-limit", metavar="RPS[:BURST]", help="token bucket: 429 beyond it")
    faults.add_argument("--max-concurrent", type=int, help="Director requests served at once")
    faults.add_argument("--faults-json", help="a complete Faults document (overrides the above)")

    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument("--access-log", action="store_true", help="log every request")
    return parser


def _counts(specs: list[str]) -> dict[str, int]:
    """OPERATION[:COUNT] flags as {operation: count}."""
    counts: dict[str, int] = {}
    for spec in specs:
        operation, _, count = spec.partition(":")
        counts[operation] = int(count or 1)
    return counts


def faults_from_args(args: argparse.Namespace) -> Faults:
    if args.faults_json:
        return Faults.model_validate_json(args.faults_json)
    fields: dict[str, Any] = {
        "down": args.down,
        "down_retry_after_seconds": args.down_retry_after,
        "lost_response_mode": args.lost_response_mode,
        "max_concurrent_director_requests": args.max_concurrent,
    }
    if args.latency or args.jitter:
        fields["latency"] = Latency(fixed_seconds=args.latency, jitter_seconds=args.jitter)
    errors = []
    for spec in args.error:
        operation, code, *rate = spec.split(":")
        errors.append(
            InjectedError(
                operation=operation,
                error_code=ErrorCode(int(code)),
                rate=float(rate[0]) if rate else 1.0,
            )
        )
    fields["errors"] = tuple(errors)
    fields["lost_responses"] = _counts(args.lost_response)
    fields["commit_then_error"] = _counts(args.commit_then_error)
    fields["field_error_after_commit"] = _counts(args.field_error_after_commit)
    fields["database_down"] = args.database_down
    if args.rate_limit:
        rps, _, burst = args.rate_limit.partition(":")
        fields["rate_limit"] = RateLimit(requests_per_second=float(rps), burst=int(burst or 1))
    return Faults.model_validate(fields)


def accounts_from_args(args: argparse.Namespace) -> dict[str, GlobalAccount] | None:
    if not args.tenant and not args.subaccount:
        return None
    subaccounts: dict[str, dict[str, Subaccount]] = {t: {} for t in args.tenant or ()}
    for spec in args.subaccount:
        account, subaccount, *region = spec.split(":", 2)
        if not account or not subaccount:
            raise ValueError(f"--subaccount {spec!r}: GLOBAL_ACCOUNT:SUBACCOUNT[:REGION] expected")
        subaccounts.setdefault(account, {})[subaccount] = Subaccount(
            region=region[0] if region else None
        )
    return {account: GlobalAccount(subaccounts=subs) for account, subs in subaccounts.items()}


def config_from_args(args: argparse.Namespace) -> SimConfig:
    secret = args.client_secret or os.environ.get(SECRET_ENV)
    if not secret:
        raise ValueError(f"--client-secret or {SECRET_ENV} is required")
    return SimConfig(
        client_id=args.client_id,
        client_secret=secret,
        accounts=accounts_from_args(args),
        consumer_type=ConsumerType(args.consumer_type),
        access_token_ttl_seconds=args.access_token_ttl,
        ott_ttl_seconds=args.ott_ttl,
        csr_token_ttl_seconds=args.csr_token_ttl,
        max_page_size=args.max_page_size,
        public_url=args.public_url,
        state_file=args.state_file,
        initial_faults=faults_from_args(args),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except (ValueError, ValidationError) as exc:
        parser.error(str(exc))

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    sim = CompassSimulator(config, access_log=args.access_log)
    with sim.running(args.host, args.port, admin_port=args.admin_port):
        endpoints = {
            "url": sim.url,
            "admin_url": sim.admin_url,
            "token_url": sim.token_url,
            "director_url": sim.director_url,
            "connector_url": sim.connector_url,
        }
        print(json.dumps(endpoints), flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
