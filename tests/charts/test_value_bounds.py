"""The charts refuse values the components would refuse: a setting's bounds (the same numbers as
on the settings, `tests/unit/test_setting_bounds.py` compares them) and a PodDisruptionBudget
that could never let a pod go."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devenv.clusters import Binaries
from tests.charts.render import CHARTS, HelmError, by_kind, helm, render

BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}


def _broker(binaries: Binaries, **values: str) -> list[dict[str, object]]:
    return render(
        binaries,
        "compass-broker",
        namespace="kcp-system",
        values={**BROKER_REQUIRED, **values},
        include_crds=False,
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-1", "minAvailable"),  # the schema
        ("100%", "minAvailable"),
        ("2", "podDisruptionBudget.minAvailable (2) must be below replicaCount (2)"),
        ("5", "podDisruptionBudget.minAvailable (5) must be below replicaCount (2)"),
    ],
)
def test_a_budget_that_keeps_every_pod_is_refused(
    binaries: Binaries, value: str, said: str
) -> None:
    with pytest.raises(HelmError, match=re.escape(said)):
        _broker(binaries, **{"podDisruptionBudget.minAvailable": value})


def test_the_same_budget_from_a_values_file_is_refused(binaries: Binaries, tmp_path: Path) -> None:
    # A values file gives helm a float, --set an int: both are numbers the template compares.
    values = tmp_path / "values.yaml"
    values.write_text(
        "director: {url: 'https://director.example.test/graphql'}\n"
        "replicaCount: 3\npodDisruptionBudget: {minAvailable: 3}\n"
    )
    with pytest.raises(HelmError, match=r"minAvailable \(3\) must be below replicaCount \(3\)"):
        helm(binaries, "template", "release", str(CHARTS / "compass-broker"), "-f", str(values))


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        ({"podDisruptionBudget.minAvailable": "1"}, 1),
        ({"podDisruptionBudget.minAvailable": "0"}, 0),
        ({"podDisruptionBudget.minAvailable": "50%"}, "50%"),
        ({"replicaCount": "3", "podDisruptionBudget.minAvailable": "2"}, 2),
    ],
)
def test_a_budget_below_the_replicas_is_rendered(
    binaries: Binaries, values: dict[str, str], kept: object
) -> None:
    (pdb,) = by_kind(_broker(binaries, **values), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == kept


def test_one_replica_has_no_budget_to_refuse(binaries: Binaries) -> None:
    objects = _broker(binaries, replicaCount="1", **{"podDisruptionBudget.minAvailable": "1"})
    assert by_kind(objects, "PodDisruptionBudget") == []


@pytest.mark.parametrize(
    ("chart", "value"),
    [
        ("compass-broker", "director.timeoutSeconds=301"),
        ("compass-broker", "director.maxConcurrency=0"),
        ("compass-broker", "policy.rateLimitBurst=10001"),
        ("compass-broker", "breaker.failureThreshold=0"),
        ("compass-agent", "broker.timeoutSeconds=3601"),
        ("compass-agent", "backoffCapSeconds=0"),
    ],
)
def test_a_value_out_of_its_settings_bounds_is_refused(
    binaries: Binaries, chart: str, value: str
) -> None:
    key, _, number = value.partition("=")
    required = (
        BROKER_REQUIRED
        if chart == "compass-broker"
        else {"broker.url": "https://compass-broker.example.test"}
    )
    namespace = "kcp-system" if chart == "compass-broker" else "kyma-system"
    with pytest.raises(HelmError, match=key.rpartition(".")[2]):
        render(binaries, chart, namespace=namespace, values={**required, key: number})
