"""The image's promises, checked from the Dockerfile text (no container engine is needed; where
one can run, tests/integration/image builds the image and runs it).

Multi-stage on a slim Python base pinned by digest; dependencies only from the hashed lock; both
entry points; a numeric non-root user; nothing that compiles or caches in the final stage; no
secret in any instruction (pip's CA bundle is a build secret, mounted for a RUN only); and the
build context `make image` hashes is what the Dockerfile copies.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devenv.image import CONTEXT_FILES, CONTEXT_PACKAGES
from tests.conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
LOCK = REPO_ROOT / "requirements.lock"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def _stages() -> tuple[dict[str, str], list[Stage]]:
    build_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in _instructions(DOCKERFILE.read_text()):
        if keyword == "ARG" and not stages and "=" in args:
            key, value = args.split("=", 1)
            build_args[key] = value
        elif keyword == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: build_args[m.group(1)], parts[0])
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif stages:
            stages[-1].instructions.append((keyword, args))
    return build_args, stages


def test_multi_stage_on_a_slim_python_base_pinned_by_digest() -> None:
    _, stages = _stages()
    assert len(stages) >= 2
    for stage in stages:
        assert re.fullmatch(
            r"docker\.io/library/python:3\.1[1-9](\.\d+)?-slim-\w+@sha256:[0-9a-f]{64}", stage.base
        ), stage.base


def test_no_secret_in_any_instruction() -> None:
    """A build argument or an environment variable is written into the image's config, a COPY
    into a layer: pip's CA bundle is none of these, only a secret mounted for a RUN."""
    build_args, stages = _stages()
    names = list(build_args) + [
        args.split("=")[0] for stage in stages for args in stage.args_of("ARG")
    ]
    env = " ".join(args for stage in stages for args in stage.args_of("ENV"))
    secretive = re.compile(r"CERT|_CA\b|TOKEN|PASSWORD|SECRET|CREDENTIAL|_KEY\b", re.IGNORECASE)
    assert not [name for name in names if secretive.search(name)]
    assert not secretive.search(env), env
    for stage in stages:
        for copied in stage.args_of("COPY") + stage.args_of("ADD"):
            assert not re.search(r"\.(pem|crt|key)\b|secret", copied, re.IGNORECASE), copied
    for stage in stages:
        for run in stage.args_of("RUN"):
            if "/run/secrets/" in run:
                assert run.startswith("--mount=type=secret,id=pip-ca "), run


def test_every_pip_download_trusts_the_ca_bundle_when_given() -> None:
    """pip reaches the package index in two RUNs (the lock; the wheel's build backend): each
    mounts the bundle and points PIP_CERT at it when there is one."""
    _, stages = _stages()
    downloads = [
        run
        for run in stages[0].args_of("RUN")
        if "-r requirements.lock" in run or "pip wheel" in run
    ]
    assert len(downloads) == 2
    for run in downloads:
        assert run.startswith("--mount=type=secret,id=pip-ca "), run
        assert "export PIP_CERT=/run/secrets/pip-ca" in run, run


def test_make_image_hashes_what_the_dockerfile_copies() -> None:
    """devenv/image.py builds from a copy of the files it hashes: exactly the COPY sources."""
    _, stages = _stages()
    sources = {
        source
        for stage in stages
        for copied in stage.args_of("COPY")
        if not copied.startswith("--from=")
        for source in copied.split()[:-1]
    }
    assert sources | {"Dockerfile"} == set(CONTEXT_FILES) | set(CONTEXT_PACKAGES)


def test_dependencies_come_from_the_hashed_lock() -> None:
    _, stages = _stages()
    installs = [run for stage in stages for run in stage.args_of("RUN") if "pip install" in run]
    lock_installs = [run for run in installs if "-r requirements.lock" in run]
    assert lock_installs, "no pip install from requirements.lock"
    assert all("--require-hashes" in run for run in lock_installs)
    # Everything else is our own wheel, installed without pulling unlocked dependencies.
    for run in installs:
        if run not in lock_installs:
            assert "--no-deps" in run, run


def test_lock_covers_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    lock_text = LOCK.read_text()
    pinned = {
        canonicalize_name(m.group(1))
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==\S+", lock_text, re.MULTILINE)
    }
    for dependency in project["dependencies"]:
        assert canonicalize_name(Requirement(dependency).name) in pinned, dependency
    blocks = re.split(r"^(?=[A-Za-z0-9_.\-]+==)", lock_text, flags=re.MULTILINE)
    for block in blocks:
        if re.match(r"[A-Za-z0-9_.\-]+==", block):
            assert "--hash=sha256:" in block, block.splitlines()[0]


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    _, stages = _stages()
    users = stages[-1].args_of("USER")
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_final_stage_has_no_compilers_or_package_caches() -> None:
    _, stages = _stages()
    final = stages[-1]
    for run in final.args_of("RUN"):
        assert not re.search(r"\b(gcc|g\+\+|build-essential|clang|make)\b", run), run
        assert "pip install" not in run, "the final stage installs nothing; it copies the venv"
    copies = final.args_of("COPY")
    assert any(c.startswith("--from=") and "/opt/venv" in c for c in copies)
    env = " ".join(final.args_of("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    build_env = " ".join(stages[0].args_of("ENV"))
    assert "PIP_NO_CACHE_DIR=1" in build_env


@pytest.mark.parametrize("script", ["compass-broker", "compass-agent"])
def test_both_entry_points_are_installed(script: str) -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert script in scripts
    module = scripts[script].split(":")[0].split(".")[0]
    _, stages = _stages()
    copied_sources = {args.split()[0] for args in stages[0].args_of("COPY")}
    assert module in copied_sources
    assert "/opt/venv/bin" in " ".join(stages[-1].args_of("ENV"))


def test_every_product_package_is_copied_into_the_build() -> None:
    """The wheel is built from what the build stage copied: a package left out would make the
    image fail at its first import (agent and broker import kubeapi and observability)."""
    find = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in find["packages"]["find"]["include"]}
    _, stages = _stages()
    copied_sources = {args.split()[0] for args in stages[0].args_of("COPY")}
    assert packages <= copied_sources, packages - copied_sources


def test_the_wheel_ships_the_product_and_nothing_else() -> None:
    """devenv (test clusters, simulator, demo), bench and tests run from the source tree; the
    distribution holds only what the two entry points import."""
    from setuptools import find_packages  # noqa: PLC0415 (only here)

    find = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = find_packages(where=str(REPO_ROOT), include=find["packages"]["find"]["include"])
    tops = {name.split(".")[0] for name in shipped}
    assert tops == {"agent", "control_plane_broker", "kubeapi", "observability"}
