"""CHANGELOG.md's version policy holds: the newest section's version is the package's, both
charts' `version` and `appVersion` (the image tag), and every section has a version of that form
and upgrade notes, newest first."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.conftest import REPO_ROOT

SECTION = re.compile(r"^## (\d+\.\d+\.\d+)\b.*$", re.MULTILINE)


def releases() -> list[tuple[str, str]]:
    """(version, text) of every release section, in the file's order."""
    text = (REPO_ROOT / "CHANGELOG.md").read_text()
    found = list(SECTION.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m.group(1), text[m.end() : end]) for m, end in zip(found, ends, strict=True)]


def test_the_newest_release_is_the_version_of_package_charts_and_image() -> None:
    newest, _ = releases()[0]
    package = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    versions = {"pyproject.toml": package}
    for chart in ("compass-broker", "compass-agent"):
        meta = yaml.safe_load((REPO_ROOT / "charts" / chart / "Chart.yaml").read_text())
        versions[f"{chart} version"] = str(meta["version"])
        versions[f"{chart} appVersion"] = str(meta["appVersion"])
    assert set(versions.values()) == {newest}, versions


def test_every_release_has_upgrade_notes_newest_first() -> None:
    found = releases()
    assert found
    for version, text in found:
        assert "**Upgrade notes**" in text, f"{version} has no upgrade notes"
    numbers = [tuple(int(part) for part in v.split(".")) for v, _ in found]
    assert numbers == sorted(numbers, reverse=True)
