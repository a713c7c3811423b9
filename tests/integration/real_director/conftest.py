"""`real_compass`: the real Compass Director stack, once per test run.

Skipped, with the reason, where the pinned Compass source cannot be had (see
docs/real-compass.md); built otherwise (`make test` builds it before pytest starts, so the
build does not run inside a test's timeout). Director's ConfigMap and Secrets go into a
namespace of their own on the session's `control_plane` cluster: no second API server, and
nothing other tests look at.

Tests share the stack: each uses tenants and runtime IDs of its own, and reads counters as
differences.

Where it can run (root and unshare(1), the sources at hand), the stack includes the real
Connector, hydrator and Oathkeeper (`real_connector`, built by `make real-compass` before
pytest starts) and one-time tokens name it as their `connectorURL`; tests that need it take
the `real_connector` fixture, which skips with the reason elsewhere.
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
from devenv.real_director.connector import (
    ConnectorUnavailable,
    RealConnector,
    build_connector,
    why_not_here,
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
def real_connector_folder(real_director_folder: Path) -> tuple[Path | None, str]:
    """(build-connector.sh's folder, "") where the real Connector can run, else (None, why)."""
    reason = why_not_here()
    if reason is not None:
        return None, reason
    try:
        return build_connector(), ""
    except ConnectorUnavailable as exc:
        if exc.source_missing:
            return None, exc.reason
        raise


@pytest.fixture(scope="session")
def real_compass(
    real_director_folder: Path,
    real_connector_folder: tuple[Path | None, str],
    control_plane: TestCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealCompass]:
    folder, _ = real_connector_folder
    stack = start_real_compass(
        tmp_path_factory.mktemp("real-compass"),
        cluster=control_plane,
        director_folder=real_director_folder,
        # Without the real Connector no one answers at a one-time token's connectorURL.
        connector_url=None
        if folder is not None
        else "https://connector.real-compass.test/connector/graphql",
        real_connector=folder is not None,
        connector_folder=folder,
    )
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def real_connector(
    real_compass: RealCompass, real_connector_folder: tuple[Path | None, str]
) -> RealConnector:
    """The real Connector of the session's stack, or a skip saying why it cannot run here."""
    if real_compass.real_connector is None:
        pytest.skip(f"the real Compass Connector cannot run here: {real_connector_folder[1]}")
    return real_compass.real_connector
