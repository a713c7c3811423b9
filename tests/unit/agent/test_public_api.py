"""The agent package's public names are exactly the intended ones, and the pure modules stay
pure: decide, retry_policy, cluster_objects, outcomes, connection_report and discovery import
no HTTP client, no Kubernetes client and no adapter (`agent.kube`, `kubeapi`), so they can be
reasoned about and benchmarked without I/O."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import agent

PKG = Path(__file__).resolve().parents[3] / "agent"
PURE = ["decide", "retry_policy", "cluster_objects", "outcomes", "connection_report", "discovery"]
FORBIDDEN = ("httpx", "kubernetes", "kubeapi", "agent.kube", "agent.process", "agent.broker_client")


def test_public_names_are_the_intended_ones() -> None:
    assert agent.__all__ == ["Agent", "AgentSettings", "main"]
    assert agent.__all__ == sorted(agent.__all__, key=str.casefold)
    for name in agent.__all__:
        getattr(agent, name)
    # httpx style: every public name the package defines is exported, and nothing else is
    # (submodules such as `agent.retry_policy` are reached by their dotted path).
    defined = sorted(
        n for n, v in vars(agent).items() if not n.startswith("_") and not isinstance(v, ModuleType)
    )
    assert defined == agent.__all__
    assert {n for n in dir(agent) if not n.startswith("_")} >= set(agent.__all__)


@pytest.mark.parametrize("name", ["Agent", "AgentSettings", "main"])
def test_each_public_name_resolves_to_the_agent_package(name: str) -> None:
    value = getattr(agent, name)
    assert value.__module__.startswith("agent.")
    assert value.__name__ == name


def test_unknown_names_are_not_invented() -> None:
    with pytest.raises(AttributeError):
        agent.Reconciler  # type: ignore[attr-defined] # noqa: B018 - the access is the test


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io_or_adapter(module: str) -> None:
    tree = ast.parse((PKG / f"{module}.py").read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    bad = [m for m in imported if m.startswith(FORBIDDEN)]
    assert not bad, f"agent/{module}.py imports {bad}"


def test_importing_the_package_and_pure_modules_loads_no_io_library() -> None:
    # A fresh interpreter: what the imports pull in transitively, not only what they name.
    code = (
        "import sys, agent, agent.decide, agent.retry_policy, agent.cluster_objects, "
        "agent.outcomes, agent.connection_report, agent.discovery; "
        "print(','.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('httpx', 'kubernetes', 'kubeapi') or m.startswith('agent.kube'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
