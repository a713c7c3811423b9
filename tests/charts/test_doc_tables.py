"""The docs' tables that restate the code are held to it (issue 38): docs/architecture.md's layer
table and code map to the import-linter contracts in pyproject.toml, docs/broker.md's problem
table to the broker's error tree and routing answers. Both sides are read when the test runs,
so a module moved or a problem added fails here until the docs say so."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane_broker.api.app import routing_problem
from control_plane_broker.errors import BrokerError
from tests.conftest import REPO_ROOT

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
BROKER_DOC = REPO_ROOT / "docs" / "broker.md"
SPAN = re.compile(r"`([^`]+)`")
# import-linter: siblings joined by ":" may import each other, by "|" may not.
INDEPENDENT, NOT_INDEPENDENT = "|", ":"


def contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def broker_layers() -> list[tuple[int, set[str], bool]]:
    """(layer number, modules, independent) from the layers contract over the whole broker;
    the bottom layer is 0, as in the docs."""
    (contract,) = [
        c
        for c in contracts()
        if c["type"] == "layers" and c["containers"] == ["control_plane_broker"]
    ]
    out = []
    for number, raw in enumerate(reversed(contract["layers"])):
        names = re.split(r"\s*[:|]\s*", " ".join(raw.split()).strip("() "))
        out.append((number, {name.strip("() ") for name in names}, INDEPENDENT in raw))
    return out


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    following = text.find("\n## ", start + 1)
    return text[start : following if following != -1 else len(text)]


def tables(markdown: str) -> list[list[list[str]]]:
    """Each table's body rows (header and rule left out), each row its cells."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif current:
            found.append(current[2:])
            current = []
    return found


def test_the_layer_table_says_what_the_contracts_enforce() -> None:
    doc = section(ARCHITECTURE.read_text(), "## Layers")
    (rows,) = tables(doc)
    told = {int(row[0]): row[2] for row in rows}
    layers = broker_layers()
    assert sorted(told) == [number for number, _, _ in layers]
    for number, _, independent in layers:
        expected = "the layers below" if independent else "its own layer"
        assert told[number].startswith(expected), (number, told[number], expected)
    # The bottom layer's promise is a forbidden contract of its own.
    bottom = {f"control_plane_broker.{name}" for name in layers[0][1]}
    pure_contracts = [
        c for c in contracts() if c["type"] == "forbidden" and bottom <= set(c["source_modules"])
    ]
    assert pure_contracts, "no contract keeps the bottom layer free of I/O"
    assert "no I/O library, no adapter" in told[0]
    forbidden = set(pure_contracts[0]["forbidden_modules"])
    assert {"httpx", "kubeapi", "control_plane_broker.kube"} <= forbidden, forbidden


def test_the_code_map_puts_every_broker_module_in_its_contract_layer() -> None:
    doc = section(ARCHITECTURE.read_text(), "## Code map")
    broker_rows = tables(doc)[0]
    documented: dict[str, int] = {}
    for row in broker_rows:
        for module in SPAN.findall(row[0]):
            assert module not in documented, f"{module} is listed twice"
            documented[module] = int(row[1])
    contracted = {module: number for number, modules, _ in broker_layers() for module in modules}
    assert set(contracted) - set(documented) == set(), "contract modules missing from the code map"
    assert set(documented) - set(contracted) == set(), "code map modules no contract names"
    wrong = {
        m: (documented[m], contracted[m]) for m in documented if documented[m] != contracted[m]
    }
    assert wrong == {}, "module: (layer in the code map, layer in the contract)"


def test_the_agent_modules_called_pure_are_the_ones_the_contract_keeps_pure() -> None:
    doc = section(ARCHITECTURE.read_text(), "## Code map")
    agent_rows = tables(doc)[1]
    pure = {f"agent.{m}" for row in agent_rows if row[1] == "pure" for m in SPAN.findall(row[0])}
    agent_contracts = [
        c
        for c in contracts()
        if c["type"] == "forbidden" and all(m.startswith("agent.") for m in c["source_modules"])
    ]
    assert [set(c["source_modules"]) for c in agent_contracts] == [pure]


def answered_problems() -> dict[str, int]:
    """slug -> status of every problem the broker answers: each class of the error tree that
    names its own problem, and the routing answers."""
    out: dict[str, int] = {}
    pending = list(BrokerError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "slug" in vars(cls):
            assert out.get(cls.slug, cls.status) == cls.status, cls
            out[cls.slug] = cls.status
    for status in (404, 405):
        body = routing_problem(StarletteHTTPException(status), "/x").body
        slug = re.search(rb'problem:([a-z-]+)"', body)
        assert slug, body
        out[slug.group(1).decode()] = status
    return out


def documented_problems() -> dict[str, int]:
    """slug -> status from the one problem table (docs/broker.md, "Errors")."""
    rows = tables(section(BROKER_DOC.read_text(), "### Errors"))[0]
    out: dict[str, int] = {}
    for row in rows:
        for slug in SPAN.findall(row[1]):
            assert slug not in out, f"{slug} is in two rows"
            out[slug] = int(row[0])
    return out


def test_the_problem_table_is_every_problem_the_broker_answers() -> None:
    documented, answered = documented_problems(), answered_problems()
    assert set(answered) - set(documented) == set(), "problems the table lacks"
    assert set(documented) - set(answered) == set(), "slugs the broker never answers"
    wrong = {s: (documented[s], answered[s]) for s in documented if documented[s] != answered[s]}
    assert wrong == {}, "slug: (status in the table, status the broker answers)"


def test_no_other_doc_repeats_the_problem_table() -> None:
    """Each table once: a status-and-slug row anywhere else is a second copy to keep in step."""
    row = re.compile(r"^\|\s*\d{3}\s*\|\s*`[a-z-]+`", re.MULTILINE)
    copies = [
        path.relative_to(REPO_ROOT)
        for path in sorted((REPO_ROOT / "docs").glob("*.md"))
        if path != BROKER_DOC and row.search(path.read_text())
    ]
    assert copies == []
