"""`compass-broker` / `python -m control_plane_broker`: settings from `BROKER_*` variables.

Exit codes: 0 after a clean shutdown (or a `--check-config` whose every contact worked), 2 for
settings that cannot work — one line per problem on stderr, each naming its environment variable,
no traceback —, 1 when `--check-config` could not reach a server the settings name.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError

from control_plane_broker.settings import Settings, serving_problems
from kubeapi import ClusterAccess, KubeconfigError, load_access
from observability import logs
from observability.config_errors import problem_lines
from observability.settings_bounds import bounds_text
from observability.startup_checks import listen_problem

PROG = "compass-broker"


def _settings_help() -> str:
    lines = ["environment variables (defaults in brackets, then the bounds of numbers):"]
    for name, field in Settings.model_fields.items():
        default = field.default if field.default is not None else ""
        limits = f" ({limit})" if (limit := bounds_text(field)) else ""
        lines.append(
            f"  BROKER_{name.upper()} [{default}]{limits}\n      {field.description or ''}"
        )
    lines.append("  KUBECONFIG: KCP access; without it the in-cluster ServiceAccount is used.")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Control-plane token broker: verifies a Kyma runtime's identity, registers "
        "it in Compass exactly once and hands its agent a one-time token.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="check the settings, then contact KCP, Director's OAuth token endpoint and "
        "Director as serving would, say what each answered, and exit (0: all fine, 1: a "
        "server failed, 2: invalid settings)",
    )
    return parser.parse_args(argv)


def _refuse(problems: list[str]) -> int:
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    return 2


def kcp_access_or_problem() -> ClusterAccess | str:
    path = os.environ.get("KUBECONFIG") or None
    try:
        return load_access(path)
    except KubeconfigError as exc:
        where = f"KUBECONFIG ({path})" if path else "KUBECONFIG (unset: in-cluster access)"
        return f"{where}: {exc.message}"
    except OSError as exc:
        return f"KUBECONFIG ({path}): cannot be read ({exc.strerror or type(exc).__name__})"


def load(argv: list[str] | None) -> tuple[Settings, ClusterAccess] | int:
    """Settings and KCP access, or the exit code when they cannot be had."""
    args = parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        return _refuse(problem_lines(exc, prefix="BROKER_"))
    problems = serving_problems(settings)
    kcp_access = kcp_access_or_problem()
    if isinstance(kcp_access, str):
        problems.append(kcp_access)
    if problems:
        return _refuse(problems)
    assert not isinstance(kcp_access, str)
    logs.setup(settings.log_level)
    if args.check_config:
        return check_config(settings, kcp_access)
    return settings, kcp_access


def check_config(settings: Settings, kcp_access: ClusterAccess) -> int:
    from control_plane_broker import preflight  # noqa: PLC0415 (only for the check)

    print(f"{PROG}: ok: settings (BROKER_*) valid, credentials file readable")
    contacts = asyncio.run(preflight.check(settings, kcp_access))
    for contact in contacts:
        print(f"{PROG}: {contact.line()}", file=sys.stdout if contact.ok else sys.stderr)
    return 0 if all(contact.ok for contact in contacts) else 1


def main(argv: list[str] | None = None) -> int:
    loaded = load(argv)
    if isinstance(loaded, int):
        return loaded
    from control_plane_broker.wiring import run  # noqa: PLC0415 (heavy; only when serving)

    settings, kcp_access = loaded
    # Not at --check-config, which may run beside a serving broker whose port this is.
    if (problem := listen_problem(settings.host, settings.port)) is not None:
        return _refuse([f"BROKER_HOST, BROKER_PORT: {problem}"])
    serve(run(settings, kcp_access=kcp_access))
    return 0


def serve(main_task: Coroutine[Any, Any, None]) -> None:
    """Runs the broker on uvloop where it is installed (declared for every OS but Windows)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        asyncio.run(main_task)
    else:
        uvloop.run(main_task)


if __name__ == "__main__":
    sys.exit(main())
