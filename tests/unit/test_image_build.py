"""devenv/image.py without building: the name the charts default to, which CA bundle pip gets,
what a build is keyed by, and why no builder can run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devenv import image


def test_the_default_name_is_registry_qualified_and_tagged_with_the_charts_app_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("IMAGE", raising=False)
    name = image.image_name()
    repository, _, tag = name.rpartition(":")
    assert repository == image.REPOSITORY
    assert "." in repository.split("/")[0], "the first component names a registry"
    for chart in ("compass-broker", "compass-agent"):
        chart_yaml = (image.CHARTS / chart / "Chart.yaml").read_text()
        assert re.search(rf'^appVersion: "?{re.escape(tag)}"?$', chart_yaml, re.MULTILINE)


def test_image_names_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGE", "registry.example.test/team/kyma-compass-pull:dev")
    assert image.image_name() == "registry.example.test/team/kyma-compass-pull:dev"


def test_the_pinned_base_is_the_dockerfiles_default() -> None:
    assert re.fullmatch(r"docker\.io/library/python:\S+@sha256:[0-9a-f]{64}", image.pinned_base())


def test_the_debian_base_is_named_by_what_it_contains() -> None:
    name = image.debian_base_name()
    assert name.startswith("localhost/kyma-compass-pull-base:bookworm-python3-python3-venv-")
    assert name == image.debian_base_name()


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, None),
        ({"PIP_CERT": "{bundle}"}, "{bundle}"),
        ({"PIP_CERT": "{other}", "IMAGE_CA_BUNDLE": "{bundle}"}, "{bundle}"),
        ({"PIP_CERT": "{bundle}", "IMAGE_CA_BUNDLE": ""}, None),
    ],
)
def test_the_ca_bundle_is_image_ca_bundle_else_pip_cert(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    variables: dict[str, str],
    expected: str | None,
) -> None:
    paths = {"bundle": tmp_path / "bundle.pem", "other": tmp_path / "other.pem"}
    for path in paths.values():
        path.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.delenv("PIP_CERT", raising=False)
    monkeypatch.delenv("IMAGE_CA_BUNDLE", raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value.format(**paths))
    found = image.ca_bundle()
    assert (None if found is None else str(found)) == (
        None if expected is None else expected.format(**paths)
    )


def test_a_ca_bundle_that_is_not_a_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("IMAGE_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(image.BuildError, match=r"IMAGE_CA_BUNDLE=.* is not a file"):
        image.ca_bundle()


def _fake_repo(root: Path) -> None:
    for name in image.CONTEXT_FILES:
        (root / name).write_text(name)
    for package in image.CONTEXT_PACKAGES:
        (root / package / "__pycache__").mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        (root / package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("")


def test_the_build_reads_and_is_keyed_by_the_copied_files_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _fake_repo(repo)
    monkeypatch.setattr(image, "REPO_ROOT", repo)
    first = image._stage_context(tmp_path / "a")
    context = tmp_path / "a"
    staged = {str(p.relative_to(context)) for p in context.rglob("*") if p.is_file()}
    assert staged == set(image.CONTEXT_FILES) | {f"{p}/__init__.py" for p in image.CONTEXT_PACKAGES}
    # Caches and files the image does not hold change nothing; a product file does.
    (repo / "agent" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\1")
    (repo / "tests" / "test_x.py").write_text("changed")
    assert image._stage_context(tmp_path / "b") == first
    (repo / "agent" / "__init__.py").write_text('"""changed"""')
    assert image._stage_context(tmp_path / "c") != first


def test_without_root_no_builder_runs_and_the_reason_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(image.os, "geteuid", lambda: 1000)
    problem = image.builder_problem()
    assert problem is not None
    assert "needs root" in problem
    assert "apt-get install -y buildah debootstrap" in problem
    with pytest.raises(image.NoBuilder, match="needs root"):
        image.ensure_builder(log=lambda _line: None)
