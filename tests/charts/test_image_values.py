"""The image the charts run: by default the registry-qualified name `make image` builds, tagged
with the chart's appVersion; `image.repository`, `image.tag` and `imagePullSecrets` point them at
a registry of one's own (README, "Install with Helm"), and bad values are refused by the schema."""

from __future__ import annotations

from typing import Any

import pytest

from devenv.clusters import Binaries
from devenv.image import REPOSITORY, app_version
from tests.charts.render import HelmError, by_kind, render

REQUIRED = {
    "compass-broker": {"director.url": "https://director.example.test/graphql"},
    "compass-agent": {"broker.url": "https://compass-broker.example.test"},
}
NAMESPACE = {"compass-broker": "kcp-system", "compass-agent": "kyma-system"}
CHARTS = sorted(REQUIRED)


def _pod_spec(binaries: Binaries, chart: str, **values: str) -> dict[str, Any]:
    objects = render(
        binaries, chart, namespace=NAMESPACE[chart], values={**REQUIRED[chart], **values}
    )
    (deployment,) = by_kind(objects, "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("chart", CHARTS)
def test_the_default_image_is_the_one_make_image_builds(binaries: Binaries, chart: str) -> None:
    spec = _pod_spec(binaries, chart)
    (container,) = spec["containers"]
    assert container["image"] == f"{REPOSITORY}:{app_version()}"
    assert "imagePullSecrets" not in spec


@pytest.mark.parametrize("chart", CHARTS)
def test_repository_tag_and_pull_secrets_point_the_chart_at_another_registry(
    binaries: Binaries, chart: str
) -> None:
    spec = _pod_spec(
        binaries,
        chart,
        **{
            "image.repository": "registry.example.test/team/kyma-compass-pull",
            "image.tag": "0.1.0-rc.1",
            "imagePullSecrets[0].name": "registry-credentials",
        },
    )
    (container,) = spec["containers"]
    assert container["image"] == "registry.example.test/team/kyma-compass-pull:0.1.0-rc.1"
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]


@pytest.mark.parametrize("chart", CHARTS)
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"imagePullSecrets[0]": "registry-credentials"}, "/imagePullSecrets/0"),
        ({"imagePullSecrets[0].name": "Registry_Credentials"}, "/imagePullSecrets/0/name"),
        ({"imagePullSecrets[0].secret": "x"}, "/imagePullSecrets/0"),
        ({"image.tag": "0.1.0@sha256:abc"}, "/image/tag"),
        ({"image.repository": ""}, "/image/repository"),
    ],
)
def test_bad_image_values_are_refused(
    binaries: Binaries, chart: str, values: dict[str, str], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render(binaries, chart, namespace=NAMESPACE[chart], values={**REQUIRED[chart], **values})
