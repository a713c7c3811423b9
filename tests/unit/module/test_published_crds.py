"""The CRDs in devenv/crds are the published ones, unchanged (see devenv/crds/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devenv.clusters import CRD_DIR, kyma_crds
from tests.conftest import REPO_ROOT

# A copy of shared/ sits beside the clone in CI, and beside the worktrees' folder locally.
CANDIDATES = [
    REPO_ROOT.parent / "shared" / "kyma-api",
    REPO_ROOT.parents[1] / "shared" / "kyma-api",
]
PUBLISHED = next((p for p in CANDIDATES if p.is_dir()), None)
EXPECTED = {
    "operator.kyma-project.io_kymas.yaml",
    "operator.kyma-project.io_moduletemplates.yaml",
    "operator.kyma-project.io_modulereleasemetas.yaml",
    "compass.kyma-project.io_compassconnections.yaml",
    "operator.kyma-project.io_applicationconnectors.yaml",
}


def test_every_test_cluster_gets_the_published_crds() -> None:
    assert {p.name for p in kyma_crds()} == EXPECTED
    assert all(p.parent == CRD_DIR for p in kyma_crds())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_copy_equals_the_published_crd(name: str) -> None:
    if PUBLISHED is None:
        pytest.skip("../shared/kyma-api is not beside the clone: nothing to compare with")
    assert isinstance(PUBLISHED, Path)
    assert (CRD_DIR / name).read_bytes() == (PUBLISHED / name).read_bytes()
