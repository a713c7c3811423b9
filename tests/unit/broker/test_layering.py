"""The pure decision modules import no I/O library and no adapter (API → domain → adapters)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "control_plane_broker"
PURE = [
    "circuit_breaker.py",
    "ratelimit.py",
    "retry.py",
    "errors.py",
    "model.py",
    "policy.py",
    "singleflight.py",
    "registration/state.py",
    "registration/naming.py",
    "identity/claims.py",
    "identity/xfcc.py",
    "api/problems.py",
    "director/errors.py",
]
FORBIDDEN = (
    "httpx",
    "kubernetes",
    "fastapi",
    "uvicorn",
    "control_plane_broker.kube",
    "control_plane_broker.director.client",
    "control_plane_broker.api.app",
)


@pytest.mark.parametrize("module", PURE)
def test_pure_module_has_no_io_imports(module: str) -> None:
    tree = ast.parse((PKG / module).read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    bad = [m for m in imported if m.startswith(FORBIDDEN)]
    assert not bad, f"{module} imports {bad}"
