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


def test_kubectl_module_pins_the_same_kubernetes_release() -> None:
    """kubectl is built from the published staging modules of the release kube-apiserver is."""
    version = _versions()["KUBERNETES_VERSION"]
    staging = "v0." + version.split(".", 1)[1]
    gomod = (TOOLCHAIN / "kubectl" / "go.mod").read_text()
    for module in ("k8s.io/kubectl", "k8s.io/client-go", "k8s.io/component-base"):
        assert f"{module} {staging}" in gomod, f"{module} is not pinned at {staging}"
    build = (TOOLCHAIN / "build.sh").read_text()
    assert "binaries=(kube-apiserver etcd helm kubectl)" in build
    assert 'require_pinned kubectl "k8s.io/kubectl v0.${KUBERNETES_VERSION#1.}"' in build


def test_promql_check_module_pins_the_prometheus_release() -> None:
    version = _versions()["PROMETHEUS_MODULE_VERSION"]
    gomod = (TOOLCHAIN / "promql-check" / "go.mod").read_text()
    assert f"github.com/prometheus/prometheus v{version}" in gomod
