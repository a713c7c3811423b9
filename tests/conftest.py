"""Fixtures shared by every test: real local API servers, started once per test run.

`control_plane`, `runtime_a` and `runtime_b` are independent clusters (own etcd, own
CA, own ServiceAccount issuer). They start together, in parallel, the first time any
test asks for one, and stop when the run ends, also when tests fail. Tests isolate
themselves with `namespace_factory` instead of restarting clusters.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devenv.clusters import Binaries, TestCluster, find_binaries, kyma_crds, start_cluster

CLUSTER_NAMES = ("control-plane", "runtime-a", "runtime-b")
REPO_ROOT = Path(__file__).resolve().parents[1]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `kill`) would otherwise end without tearing
    # down a fixture or running an atexit hook, leaving API servers, etcd, nodes and real
    # Directors running. As a KeyboardInterrupt it stops the way Ctrl-C does: every
    # fixture's teardown runs, then devenv's atexit hooks.
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    return find_binaries()


@pytest.fixture(scope="session")
def clusters(
    binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestCluster]]:
    started: dict[str, TestCluster] = {}
    # mktemp is not thread-safe: make the folders before the threads start.
    workdirs = {name: tmp_path_factory.mktemp(name) for name in CLUSTER_NAMES}

    def start(name: str) -> TestCluster:
        cluster = start_cluster(name, binaries, workdir=workdirs[name])
        started[name] = cluster
        cluster.apply_crds(kyma_crds())
        return cluster

    try:
        with ThreadPoolExecutor(max_workers=len(CLUSTER_NAMES)) as pool:
            list(pool.map(start, CLUSTER_NAMES))
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()


@pytest.fixture(scope="session")
def control_plane(clusters: dict[str, TestCluster]) -> TestCluster:
    return clusters["control-plane"]


@pytest.fixture(scope="session")
def runtime_a(clusters: dict[str, TestCluster]) -> TestCluster:
    return clusters["runtime-a"]


@pytest.fixture(scope="session")
def runtime_b(clusters: dict[str, TestCluster]) -> TestCluster:
    return clusters["runtime-b"]


NamespaceFactory = Callable[..., str]


@pytest.fixture
def namespace_factory(request: pytest.FixtureRequest) -> NamespaceFactory:
    """Makes a fresh namespace on a cluster: `namespace_factory(cluster, labels=None) -> name`.

    Namespaces are not deleted afterwards: without kube-controller-manager they would
    stay Terminating forever, and unique names already keep tests apart.
    """
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")

    def make(cluster: TestCluster, *, labels: dict[str, str] | None = None) -> str:
        return cluster.create_namespace(f"{stem}-{uuid.uuid4().hex[:6]}", labels=labels)

    return make
