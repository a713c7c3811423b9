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

from agent.process import Agent
from agent.settings import AgentSettings
from kubeapi import KubeconfigError
from observability import logs
from observability.config_errors import problem_lines

PROG = "compass-agent"


def _default_text(value: object) -> str:
    """A default as it would be set in the environment; unset ones say so, not `None`."""
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _settings_help() -> str:
    lines = ["environment variables (defaults in brackets):"]
    for name, info in AgentSettings.model_fields.items():
        if info.is_required():
            default = "required"
        else:
            default = _default_text(info.get_default(call_default_factory=True))
        text = info.description or ""
        lines.append(f"  AGENT_{name.upper()} [{default}]" + (f"\n      {text}" if text else ""))
    return "\n".join(lines)


def _refuse(problems: list[str]) -> int:
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
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
        return _refuse(problem_lines(e, prefix="AGENT_"))
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
        where = (
            f"AGENT_KUBECONFIG ({settings.kubeconfig})"
            if settings.kubeconfig is not None
            else "AGENT_KUBECONFIG (unset: in-cluster access)"
        )
        return _refuse([f"{where}: {e.message}"])
    try:
        await agent.run(stop)
    except RuntimeError:
        logging.getLogger("agent").exception("agent died")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
