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


DOCS_WORD_BUDGET = 25_000


def test_the_docs_fit_their_word_budget() -> None:
    """Issue 38: the docs are something a reader can finish. Every page of docs/ counts,
    the generated benchmark report too; the design records do not (they keep the stories and
    measurements behind the rules, linked from the pages). Words as `wc -w` counts them."""
    pages = [
        path
        for path in sorted((REPO_ROOT / "docs").rglob("*.md"))
        if "design" not in path.relative_to(REPO_ROOT / "docs").parts
    ]
    counts = {str(path.relative_to(REPO_ROOT)): len(path.read_text().split()) for path in pages}
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= DOCS_WORD_BUDGET, f"docs have {total} words, the budget is 25,000: {largest}"
