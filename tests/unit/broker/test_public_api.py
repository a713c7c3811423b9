"""Each broker package exports exactly the intended names (httpx style: `__all__` is the list,
every listed name resolves, and no other public non-module attribute leaks out)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

EXPECTED: dict[str, set[str]] = {
    "control_plane_broker": {
        "BrokerError",
        "DirectorCredentials",
        "PermanentError",
        "Settings",
        "TemporaryError",
        "load_director_credentials",
    },
    "control_plane_broker.api": {
        "MEDIA_TYPE",
        "TYPE_PREFIX",
        "Problem",
        "create_app",
        "problem_for",
    },
    "control_plane_broker.director": {
        "DirectorClient",
        "DirectorNotFound",
        "DirectorPermanent",
        "DirectorRetryable",
        "DirectorRuntime",
        "OAuthTokenSource",
        "OneTimeToken",
        "RuntimeRegisterInput",
        "classify",
    },
    "control_plane_broker.overload": set(),
    "control_plane_broker.identity": {
        "CountingVerifier",
        "Identity",
        "JwksVerifier",
        "TokenReviewVerifier",
        "Verifier",
        "XfccVerifier",
    },
    # The Kubernetes layer itself is `kubeapi`'s; the broker's package holds its adapters only.
    "control_plane_broker.kube": {
        "KymaEvents",
        "MappingRepository",
        "RuntimeAccess",
        "kyma_informer",
        "mapping_informer",
    },
    "control_plane_broker.registration": {"Mapping", "Registered", "RegistrationService"},
}


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_package_exports_exactly_the_intended_names(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert set(exported) == EXPECTED[package]
    assert len(exported) == len(set(exported)), "a name listed twice"
    for name in exported:
        assert getattr(module, name, None) is not None, f"{package}.{name} does not resolve"
    # Submodules become attributes once imported; everything else public must be listed.
    leaked = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } - set(exported)
    assert not leaked, f"{package} exposes unlisted names {sorted(leaked)}"


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_each_package_imports_alone_without_cycles_or_warnings(package: str) -> None:
    # A fresh interpreter: an import cycle hidden by the order of earlier imports shows here.
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", f"import {package}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
