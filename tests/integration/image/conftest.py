"""`image_archive`: the product image built from the Dockerfile, once per test run.

Built with the builder `make image` uses (buildah on storage of its own, a base from Debian's
packages where no registry serves the pinned one) and taken from its cache: `make test` builds it
before pytest starts, so here it is found by the hash of its inputs in a second. Skipped, with
the reason, where no builder can run (not root, buildah missing); tests/unit/test_dockerfile.py
checks the Dockerfile without one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv.image import NoBuilder, build_image, builder_problem, working_container


def _log(line: str) -> None:
    print(f"image: {line}", file=sys.stderr)


@pytest.fixture(scope="session")
def image_archive() -> Path:
    problem = builder_problem()
    if problem is not None:
        pytest.skip(f"no image builder can run here: {problem}")
    try:
        return build_image(log=_log)
    except NoBuilder as exc:
        pytest.skip(f"no image builder can run here: {exc}")


@pytest.fixture(scope="session")
def image_container(image_archive: Path) -> Iterator[str]:
    """A working container of the built image: its filesystem, run with chroot isolation."""
    with working_container(image_archive) as container:
        yield container
