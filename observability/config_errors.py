"""Settings that cannot be used, said as an operator sets them: one line per problem, each
naming the environment variable (`BROKER_IDENTITY_MODE`), never a Python field name
(`identity_mode`), a pydantic error URL or a traceback.

Holds: a value is quoted only shortened and escaped (`repr`), so a hostile or multi-line value
cannot break the one-line-per-problem shape or reach a terminal as control characters.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

MAX_VALUE_CHARS = 60
_VALUE_ERROR = "Value error, "


def quoted(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _variable(loc: tuple[int | str, ...], prefix: str) -> str | None:
    if not loc:
        return None
    name = f"{prefix}{str(loc[0]).upper()}"
    items = [part for part in loc[1:] if isinstance(part, int)]
    return name + (f" (item {items[0] + 1})" if items else "")


def problem_lines(exc: ValidationError, *, prefix: str) -> list[str]:
    """Each error of `exc` as `VARIABLE: what is wrong (got 'value')`; a rule between several
    settings (a model validator) names its variables in its own message."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        message = str(error.get("msg", "invalid"))
        message = message.removeprefix(_VALUE_ERROR)
        variable = _variable(tuple(error.get("loc", ())), prefix)
        if variable is None:
            lines.append(message)
            continue
        given: Any = error.get("input")
        shown = quoted(given)
        skip = isinstance(given, dict) or given is None or shown in message  # said already
        got = "" if skip else f" (got {shown})"
        lines.append(f"{variable}: {message}{got}")
    return lines
