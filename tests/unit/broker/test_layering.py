"""The pure decision modules import no I/O library and no adapter (API → domain → adapters);
every module sits in one layer and imports only its own layer or below."""

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
    "identity/enrolment_rules.py",
    "api/problems.py",
    "director/errors.py",
    "director/admission.py",
    "connection.py",
    "revocation.py",
    "text.py",
    "pacing.py",
]
FORBIDDEN = (
    "httpx",
    "kubeapi",
    "kubernetes",
    "fastapi",
    "starlette",
    "uvicorn",
    "control_plane_broker.kube",
    "control_plane_broker.director.client",
    "control_plane_broker.director.guard",
    "control_plane_broker.api.app",
    "control_plane_broker.api.server",
)


def _imports(path: Path) -> list[str]:
    imported: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    return imported


@pytest.mark.parametrize("module", PURE)
def test_pure_module_has_no_io_imports(module: str) -> None:
    bad = [m for m in _imports(PKG / module) if m.startswith(FORBIDDEN)]
    assert not bad, f"{module} imports {bad}"


# --- layers: a module imports only from its own layer or below ---------------------------------

LAYERS: dict[str, int] = {
    # 0: pure decisions, data, configuration, metrics/log plumbing
    **dict.fromkeys(
        [
            "circuit_breaker",
            "ratelimit",
            "retry",
            "errors",
            "model",
            "policy",
            "singleflight",
            "settings",
            "metrics",
            "registration.state",
            "registration.naming",
            "identity.claims",
            "identity.xfcc",
            "identity.enrolment_rules",
            "api.problems",
            "director.errors",
            "director.documents",
            "director.models",
            "director.admission",
            "supervisor",  # keeps tasks running; decides nothing about runtimes
            "connection",
            "revocation",
            "text",
            "pacing",
        ],
        0,
    ),
    # 1: adapters (Kubernetes through kubeapi, Director, identity proofs)
    **dict.fromkeys(
        [
            "capped",
            "kube.caches",
            "kube.events",
            "kube.mappings",
            "kube.runtime_access",
            "director.client",
            "director.guard",
            "director.oauth",
            "identity.jwks",
            "identity.tokenreview",
            "identity.verifier",
            "identity.enrolment",
            "identity.screening",
            "identity.deny_list",
        ],
        1,
    ),
    # 2: use cases
    **dict.fromkeys(
        [
            "registration.service",
            "status",
            "issuing",
            "reconciler",
            "reporting",
            "revocation_gate",
        ],
        2,
    ),
    **dict.fromkeys(["api.access", "api.app", "api.door", "api.server"], 3),  # the HTTP surface
    "wiring": 4,  # the composition root
    "preflight": 4,  # --check-config: contacts what the composition root would
    "__main__": 5,
}
PACKAGES = {"", "api", "director", "identity", "kube", "registration"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    return ".".join(rel.parts)


def _internal_imports(path: Path) -> list[str]:
    """Broker modules a file imports, as names relative to the package (`kube.client`)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if not node.module.startswith("control_plane_broker"):
                continue
            base = node.module.removeprefix("control_plane_broker").lstrip(".")
            if base in PACKAGES:  # `from pkg import submodule [as x]`
                out += [f"{base}.{a.name}".lstrip(".") for a in node.names]
            else:
                out.append(base)
        elif isinstance(node, ast.Import):
            out += [
                a.name.removeprefix("control_plane_broker.")
                for a in node.names
                if a.name.startswith("control_plane_broker.")
            ]
    return out


IO_LIBRARIES = ("httpx", "kubeapi", "kubernetes", "fastapi", "starlette", "uvicorn")


@pytest.mark.parametrize("module", sorted(m for m, layer in LAYERS.items() if layer == 0))
def test_the_bottom_layer_talks_to_nothing(module: str) -> None:
    # Configuration, metrics and task plumbing included: no network client, no Kubernetes.
    path = PKG / (module.replace(".", "/") + ".py")
    bad = [m for m in _imports(path) if m.startswith(IO_LIBRARIES)]
    assert not bad, f"{module} (layer 0) imports {bad}"


def test_every_module_has_a_layer() -> None:
    modules = {_module_name(p) for p in PKG.rglob("*.py") if p.name != "__init__.py"}
    assert modules == set(LAYERS), "place new modules in LAYERS"


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_module_imports_only_its_layer_or_below(module: str) -> None:
    path = PKG / (module.replace(".", "/") + ".py")
    upward = [
        target
        for target in _internal_imports(path)
        if target in LAYERS and LAYERS[target] > LAYERS[module]
    ]
    assert not upward, f"{module} (layer {LAYERS[module]}) imports higher layers: {upward}"
    # Package re-exports are for outside users; inside, import the defining module (no cycles).
    via_package = [t for t in _internal_imports(path) if t not in LAYERS]
    assert not via_package, f"{module} imports {via_package} through a package __init__"
