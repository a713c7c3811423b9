"""Which facts of the docs at an older commit the docs of the working tree no longer state.

Shortening the docs (issue 38: a reader can finish them) must not lose a fact. A fact here is
what a reader would act on and a tool can find again: a `code span` (names, commands, paths,
settings, slugs), an environment variable, a metric, an HTTP status with its slug, and a
number with its unit. Each fact of the old docs must appear somewhere in the new ones, in any
Markdown file of the repository (facts may move; each table is kept once), the design records
and the benchmark report included: a measurement story may move into a record, a figure into the
report, and neither is lost. Prose facts are
not seen by this check; it finds the dropped names and numbers, which is where a rewrite
loses most.

    python -m devenv.docs_facts 7497976            # every Markdown file at that commit
    python -m devenv.docs_facts 7497976 docs/broker.md docs/overload.md

Prints each missing fact with the old file and line it came from, and exits 1 when there is
one. A fact that is no longer true is removed on purpose: say so in the commit message.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Design records keep their own history; the generated benchmark report is rewritten by
# `python -m bench`, never shortened by hand: their facts are not checked, but they hold moved
# ones.
EXCLUDED = ("docs/design/", "docs/benchmarks.md", "CHANGELOG.md")

_CODE_SPAN = re.compile(r"`([^`\n]{2,120})`")
_VARIABLE = re.compile(r"\b(?:BROKER|AGENT|KUBEBUILDER|DEMO|KLM|OCM)_[A-Z0-9_]+\b")
_METRIC = re.compile(r"\b(?:broker|agent)_[a-z0-9_]{3,}\b")
_NUMBER_WITH_UNIT = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|min|h|%|x|\u00d7|MiB|MB|GiB|GB|KiB|KB|days?|"
    r"tokens/s|pairs/s|calls?|runtimes|words)(?![\w/])"
)


@dataclass(frozen=True)
class Fact:
    text: str
    path: str
    line: int


def markdown_files(commit: str | None, *, excluded: tuple[str, ...] = EXCLUDED) -> list[str]:
    if commit is None:
        listing = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    else:
        listing = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", commit],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return [
        path
        for path in listing.splitlines()
        if path.endswith(".md") and not path.startswith(excluded)
    ]


def read(path: str, commit: str | None) -> str:
    if commit is None:
        file = REPO_ROOT / path
        return file.read_text() if file.is_file() else ""
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def facts(path: str, text: str) -> Iterator[Fact]:
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        # A fenced block's lines are facts as whole lines (commands a reader copies).
        if in_fence:
            if line.strip():
                yield Fact(line.strip(), path, number)
            continue
        for pattern in (_CODE_SPAN, _VARIABLE, _METRIC, _NUMBER_WITH_UNIT):
            for match in pattern.finditer(line):
                found = match.group(1) if pattern is _CODE_SPAN else match.group(0)
                yield Fact(found.strip(), path, number)


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", ""))


def missing(old: Iterable[Fact], new_corpus: str) -> list[Fact]:
    corpus = _normalised(new_corpus)
    seen: set[str] = set()
    lost = []
    for fact in old:
        if fact.text in seen:
            continue
        seen.add(fact.text)
        if _normalised(fact.text) not in corpus:
            lost.append(fact)
    return lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.docs_facts",
        description=(
            "List the facts (code spans, settings, metrics, numbers with units, fenced lines) "
            "of the Markdown docs at COMMIT that no Markdown file of the working tree states. "
            "Exit 1 when one is missing."
        ),
    )
    parser.add_argument("commit", help="the older commit whose docs are the reference")
    parser.add_argument(
        "paths", nargs="*", help="only these old files (default: every Markdown file)"
    )
    args = parser.parse_args(argv)
    old_paths = args.paths or markdown_files(args.commit)
    new_corpus = "\n".join(
        read(path, None) for path in markdown_files(None, excluded=("CHANGELOG.md",))
    )
    lost = missing(
        (fact for path in old_paths for fact in facts(path, read(path, args.commit))), new_corpus
    )
    for fact in lost:
        print(f"{fact.path}:{fact.line}: {fact.text}")
    total = len({f.text for path in old_paths for f in facts(path, read(path, args.commit))})
    print(f"{len(lost)} of {total} facts of {len(old_paths)} file(s) missing", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
