"""`compass-agent` / `python -m agent`: runs the agent until SIGTERM or SIGINT.

Configuration comes only from `AGENT_*` environment variables (see `--help`); the exit code is
0 after a clean shutdown, 2 for invalid settings, 1 when the agent died.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from agent.app import Agent
from agent.settings import AgentSettings

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra=` fields become keys. Callers never pass secrets."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


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
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # request lines would repeat our logs
    return asyncio.run(_run(settings))


async def _run(settings: AgentSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Agent(settings).run(stop)
    except RuntimeError:
        logging.getLogger("agent").exception("agent died")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
