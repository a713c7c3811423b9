"""The README documents every agent setting, with its default where the default is a value."""

from __future__ import annotations

import re
from enum import Enum

from agent.settings import AgentSettings
from tests.conftest import REPO_ROOT


def _rows() -> dict[str, str]:
    text = (REPO_ROOT / "README.md").read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(AGENT_[A-Z_]+)` \| ([^|]*) \|", text, re.MULTILINE)
    }


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    rows = _rows()
    for name, field in AgentSettings.model_fields.items():
        variable = f"AGENT_{name.upper()}"
        assert variable in rows, f"README.md lacks {variable}"
        default = field.default
        if isinstance(default, Enum):
            default = default.value
        if isinstance(default, bool):
            default = str(default).lower()
        if isinstance(default, float) and default.is_integer():
            default = int(default)
        if isinstance(default, str | int | float) and default != "":
            assert f"`{default}`" in rows[variable], (
                f"{variable}: README default is {rows[variable]}"
            )
