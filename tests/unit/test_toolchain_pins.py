"""The control-plane versions are pinned once (versions.env); the Go modules must agree."""

from __future__ import annotations

from tests.conftest import REPO_ROOT

TOOLCHAIN = REPO_ROOT / "devenv" / "toolchain"


def _versions() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (TOOLCHAIN / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def test_kube_apiserver_module_pins_the_release_and_its_staging_modules() -> None:
    version = _versions()["KUBERNETES_VERSION"]
    gomod = (TOOLCHAIN / "kube-apiserver" / "go.mod").read_text()
    assert f"k8s.io/kubernetes v{version}" in gomod
    staging = "v0." + version.split(".", 1)[1]
    replaces = [line.strip() for line in gomod.splitlines() if "=>" in line]
    assert len(replaces) >= 30
    for line in replaces:
        module, target = (part.strip() for part in line.removeprefix("replace").split("=>"))
        assert module.startswith("k8s.io/")
        assert target == f"{module} {staging}"


def test_etcd_module_pins_the_release() -> None:
    version = _versions()["ETCD_VERSION"]
    gomod = (TOOLCHAIN / "etcd" / "go.mod").read_text()
    assert f"go.etcd.io/etcd/server/v3 v{version}" in gomod
