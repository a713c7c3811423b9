"""Every relative link between the repository's Markdown files points at a file that exists
and, when it names an anchor, at a heading that file has (GitHub's anchor rules). Shortening
and moving docs breaks links first; this finds them before a reader does."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from devenv.docs_facts import markdown_files
from tests.conftest import REPO_ROOT

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*```")


def _markdown_files() -> list[Path]:
    listed = markdown_files(None, excluded=())
    return [REPO_ROOT / path for path in listed if (REPO_ROOT / path).is_file()]


def _prose(path: Path) -> list[str]:
    """The file's lines outside fenced blocks (a link in an example is not a link)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
    to hyphens."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r'<a (?:name|id)="([^"]+)"', path.read_text()))
    return frozenset(found)


def broken_links(path: Path) -> list[str]:
    broken = []
    for line in _prose(path):
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: checked by nobody here, on purpose (no network)
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{target}: {linked.name} has no heading #{anchor}")
    return broken


def test_the_anchor_rules_are_githubs() -> None:
    assert slug("Module state = the agent's readiness") == "module-state--the-agents-readiness"
    assert slug("`BROKER_API_DOCS` and /openapi.json") == "broker_api_docs-and-openapijson"


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = {
        str(path.relative_to(REPO_ROOT)): broken
        for path in _markdown_files()
        if (broken := broken_links(path))
    }
    assert not problems, problems


def test_a_missing_file_and_a_missing_heading_are_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#real-heading) [gone](c.md) [moved](b.md#old-heading) `[x](y.md)`\n"
        "```\n[example](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "c.md: no such file",
        "b.md#old-heading: b.md has no heading #old-heading",
    ]
