"""Docs and module metadata that point at things: the module's icon is a file of this repository
(an SVG), the README counts the commands it lists, and docs/architecture.md stays one screenful
a maintainer reads whole."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import yaml

from tests.conftest import REPO_ROOT

RAW = "https://raw.githubusercontent.com/kyma-project/kyma-compass-pull/main/"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4}


def test_the_module_icon_is_an_svg_in_this_repository() -> None:
    config = yaml.safe_load((REPO_ROOT / "module" / "module-config.yaml").read_text())
    for icon in config["icons"]:
        assert icon["link"].startswith(RAW), icon["link"]
        path = REPO_ROOT / icon["link"].removeprefix(RAW)
        assert path.is_file(), f"{icon['link']} points at {path}, which does not exist"
        root = ET.fromstring(path.read_text())
        assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_the_readme_counts_the_commands_it_lists() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    match = re.search(
        r"^## The (\w+) commands\n\n```sh\n(.*?)```", readme, re.MULTILINE | re.DOTALL
    )
    assert match, "README has no '## The <n> commands' section"
    listed = [line for line in match.group(2).splitlines() if line.startswith("make ")]
    assert NUMBERS[match.group(1)] == len(listed), (match.group(1), listed)


def test_the_architecture_page_fits_its_budget() -> None:
    """Issue 38: the page a new maintainer reads first stays within 150 lines; details go to
    the page of their part, linked from it."""
    lines = (REPO_ROOT / "docs" / "architecture.md").read_text().splitlines()
    assert len(lines) <= 150, f"docs/architecture.md has {len(lines)} lines, the budget is 150"
