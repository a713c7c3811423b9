"""`compass-agent` / `python -m agent`: runs the agent until SIGTERM or SIGINT.

Configuration comes only from `AGENT_*` environment variables (see `--help`); the exit code is
0 after a clean shutdown, 2 for invalid settings or an unusable kubeconfig, 1 when the agent
died.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from agent.app import Agent
from agent.settings import AgentSettings
from kubeapi import KubeconfigError
from observability import logs


def _settings_help() -> str:
    lines = ["environment variables:"]
    for name, info in AgentSettings.model_fields.items():
        value = None if info.is_required() else info.get_default(call_default_factory=True)
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        default = "(required)" if info.is_required() else f"default {value!s}"
        text = info.description or ""
        lines.append(f"  AGENT_{name.upper():<28} {default}. {text}".rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="compass-agent",
        description=(
            "Pulls a Compass one-time token from the Kyma control-plane broker when the "
            "application-connector module is enabled, writes it to the compass-agent-configuration "
            "secret, and pulls a fresh one whenever the Compass connection fails."
        ),
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    try:
        settings = AgentSettings()
    except ValidationError as e:
        print(f"compass-agent: invalid settings:\n{e}", file=sys.stderr)
        return 2
    logs.setup(settings.log_level)
    return asyncio.run(_run(settings))


async def _run(settings: AgentSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        agent = Agent(settings)
    except KubeconfigError as e:
        logging.getLogger("agent").error(
            "cannot use the kubeconfig", extra={"reason": e.reason, "error": e.message}
        )
        return 2
    try:
        await agent.run(stop)
    except RuntimeError:
        logging.getLogger("agent").exception("agent died")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
