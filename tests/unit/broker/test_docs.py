"""The README documents every broker setting with its real default, and no setting that is
gone; the CLI shows them all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from control_plane_broker.settings import Settings

DOC = Path(__file__).resolve().parents[3] / "README.md"


def test_every_setting_documented_with_its_default() -> None:
    text = DOC.read_text()
    for name, field in Settings.model_fields.items():
        default = "" if field.default is None else field.default
        if isinstance(default, bool):
            default = str(default).lower()
        row = f"| `BROKER_{name.upper()}` | `{default}` |"
        assert row in text, f"README.md lacks or misstates {row}"


def test_no_documented_setting_is_gone() -> None:
    documented = set(re.findall(r"^\| `BROKER_([A-Z0-9_]+)` \|", DOC.read_text(), re.MULTILINE))
    assert documented, "README.md has no settings table"
    gone = sorted(documented - {name.upper() for name in Settings.model_fields})
    assert not gone, f"README.md documents settings that no longer exist: {gone}"


def test_help_lists_settings() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "control_plane_broker", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "BROKER_IDENTITY_MODE" in out
    assert "BROKER_DIRECTOR_CREDENTIALS_FILE" in out
