"""`compass-agent` / `python -m agent`: runs the agent until SIGTERM or SIGINT.

Configuration comes only from `AGENT_*` environment variables (see `--help`); the exit code is
0 after a clean shutdown (or a `--check-config` that found nothing wrong), 2 for settings that
cannot work — invalid values, files that cannot be read, an unusable kubeconfig, a health address
that cannot be listened on: one line per problem on stderr, each naming its variable, no
traceback —, 1 when the agent died.
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
from agent.settings import AgentSettings, split_address, startup_problems
from kubeapi import KubeconfigError, access_from_kubeconfig_file, in_cluster_access
from observability import logs
from observability.config_errors import problem_lines
from observability.settings_bounds import bounds_text
from observability.startup_checks import listen_problem

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
    lines = ["environment variables (defaults in brackets, then the bounds of numbers):"]
    for name, info in AgentSettings.model_fields.items():
        if info.is_required():
            default = "required"
        else:
            default = _default_text(info.get_default(call_default_factory=True))
        limits = f" ({limit})" if (limit := bounds_text(info)) else ""
        text = info.description or ""
        lines.append(
            f"  AGENT_{name.upper()} [{default}]{limits}" + (f"\n      {text}" if text else "")
        )
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
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="check the settings, the files they name (broker CA bundle, client certificate "
        "and key) and the kubeconfig (or the in-cluster ServiceAccount), say so and exit "
        "(0: all fine, 2: a problem, one line each); contacts nothing",
    )
    args = parser.parse_args(argv)
    try:
        settings = AgentSettings()
    except ValidationError as e:
        return _refuse(problem_lines(e, prefix="AGENT_"))
    problems = startup_problems(settings)
    if (kubeconfig := kubeconfig_problem(settings)) is not None:
        problems.append(kubeconfig)
    if problems:
        return _refuse(problems)
    if args.check_config:
        # The health address is not tried here: run next to a running agent, its port is taken.
        print(f"{PROG}: ok: settings (AGENT_*) valid, files readable, kubeconfig usable")
        return 0
    if (listen := listen_problem(*split_address(settings.health_address))) is not None:
        return _refuse([f"AGENT_HEALTH_ADDRESS: {listen}"])
    logs.setup(settings.log_level)
    return asyncio.run(_run(settings))


def kubeconfig_problem(settings: AgentSettings) -> str | None:
    where = (
        f"AGENT_KUBECONFIG ({settings.kubeconfig})"
        if settings.kubeconfig is not None
        else "AGENT_KUBECONFIG (unset: in-cluster access)"
    )
    try:
        if settings.kubeconfig is not None:
            access_from_kubeconfig_file(settings.kubeconfig)
        else:
            in_cluster_access()
    except KubeconfigError as e:
        return f"{where}: {e.message}"
    return None


async def _run(settings: AgentSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        agent = Agent(settings)
    except KubeconfigError as e:  # changed since it was checked
        return _refuse([f"AGENT_KUBECONFIG: {e.message}"])
    try:
        await agent.run(stop)
    except RuntimeError:
        logging.getLogger("agent").exception("agent died")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
