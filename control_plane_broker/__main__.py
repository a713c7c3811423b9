"""`compass-broker` / `python -m control_plane_broker`: settings from `BROKER_*` variables."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any

from control_plane_broker.settings import Settings
from kubeapi import ClusterAccess, KubeconfigError, load_access
from observability import logs


def _settings_help() -> str:
    lines = ["environment variables (defaults in brackets):"]
    for name, field in Settings.model_fields.items():
        default = field.default if field.default is not None else ""
        lines.append(f"  BROKER_{name.upper()} [{default}]\n      {field.description or ''}")
    lines.append("  KUBECONFIG: KCP access; without it the in-cluster ServiceAccount is used.")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compass-broker",
        description="Control-plane token broker: verifies a Kyma runtime's identity, registers "
        "it in Compass exactly once and hands its agent a one-time token.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check-config", action="store_true", help="validate settings and exit")
    return parser.parse_args(argv)


def load(argv: list[str] | None) -> tuple[Settings, ClusterAccess] | int:
    """Settings and KCP access, or the exit code when they cannot be had."""
    args = parse_args(argv)
    settings = Settings()
    logs.setup(settings.log_level)
    try:
        kcp_access = load_access(os.environ.get("KUBECONFIG") or None)
    except (KubeconfigError, OSError) as exc:
        print(f"compass-broker: cannot reach KCP: {exc}", file=sys.stderr)
        return 2
    return 0 if args.check_config else (settings, kcp_access)


def main(argv: list[str] | None = None) -> int:
    loaded = load(argv)
    if isinstance(loaded, int):
        return loaded
    from control_plane_broker.wiring import run  # noqa: PLC0415 (heavy; only when serving)

    settings, kcp_access = loaded
    serve(run(settings, kcp_access=kcp_access))
    return 0


def serve(main_task: Coroutine[Any, Any, None]) -> None:
    """Runs the broker on uvloop where it is installed (it is, with uvicorn[standard])."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        asyncio.run(main_task)
    else:
        uvloop.run(main_task)


if __name__ == "__main__":
    sys.exit(main())
