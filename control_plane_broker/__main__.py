"""`compass-broker` / `python -m control_plane_broker`: settings from `BROKER_*` variables."""

from __future__ import annotations

import argparse
import asyncio
import sys

from control_plane_broker.kube.config import KubeconfigError, load_kcp_access
from control_plane_broker.settings import Settings
from observability import logs


def _settings_help() -> str:
    lines = ["environment variables (defaults in brackets):"]
    for name, field in Settings.model_fields.items():
        default = field.default if field.default is not None else ""
        lines.append(f"  BROKER_{name.upper()} [{default}]\n      {field.description or ''}")
    lines.append("  KUBECONFIG: KCP access; without it the in-cluster ServiceAccount is used.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="compass-broker",
        description="Control-plane token broker: verifies a Kyma runtime's identity, registers "
        "it in Compass exactly once and hands its agent a one-time token.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check-config", action="store_true", help="validate settings and exit")
    args = parser.parse_args(argv)
    settings = Settings()
    logs.setup(settings.log_level)
    try:
        kcp_access = load_kcp_access()
    except (KubeconfigError, OSError) as exc:
        print(f"compass-broker: cannot reach KCP: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        return 0
    from control_plane_broker.wiring import run  # noqa: PLC0415 (heavy; only when serving)

    asyncio.run(run(settings, kcp_access=kcp_access))
    return 0


if __name__ == "__main__":
    sys.exit(main())
