"""`real_compass`: the real Compass Director stack, once per test run.

Skipped, with the reason, where the pinned Compass source cannot be had (see
docs/real-compass.md); built otherwise (`make test` builds it before pytest starts, so the
build does not run inside a test's timeout). Director's ConfigMap and Secrets go into a
namespace of their own on the session's `control_plane` cluster: no second API server, and
nothing other tests look at.

Tests share the stack: each uses tenants and runtime IDs of its own, and reads counters as
differences.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv.clusters import TestCluster
from devenv.real_director import (
    CompassSourceMissing,
    RealCompass,
    build_director,
    find_compass_source,
    start_real_compass,
)


@pytest.fixture(scope="session")
def real_director_folder() -> Path:
    """The folder build.sh prints (the binary and its source tree), or a skip."""
    where, reason = find_compass_source()
    if where is None:
        pytest.skip(f"the real Compass Director cannot be built here: {reason}")
    try:
        return build_director()
    except CompassSourceMissing as exc:
        pytest.skip(f"the real Compass Director cannot be built here: {exc}")


@pytest.fixture(scope="session")
def real_compass(
    real_director_folder: Path,
    control_plane: TestCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealCompass]:
    stack = start_real_compass(
        tmp_path_factory.mktemp("real-compass"),
        cluster=control_plane,
        director_folder=real_director_folder,
        connector_url="https://connector.real-compass.test/connector/graphql",
    )
    try:
        yield stack
    finally:
        stack.stop()
