"""The charts' values: `extraEnv` values are strings and may not repeat a variable the chart sets
(both refused when rendering, not by the API server on a later upgrade); the agent chart needs a
broker URL source and kyma-system; and the defaults the charts set are the ones the README
documents (or differ for a reason written here)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from devenv.clusters import Binaries
from tests.charts.render import HelmError, by_kind, render
from tests.conftest import REPO_ROOT

BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}
AGENT_REQUIRED = {"broker.url": "https://compass-broker.example.test"}
REQUIRED = {"compass-broker": BROKER_REQUIRED, "compass-agent": AGENT_REQUIRED}
NAMESPACE = {"compass-broker": "kcp-system", "compass-agent": "kyma-system"}
README_ROW = re.compile(r"^\| `((?:BROKER|AGENT)_[A-Z0-9_]+)` \| `?([^|`]*)`? \|", re.MULTILINE)

# Set by the chart to something else than the settings' default, and why.
NOT_THE_DEFAULT = {
    "BROKER_PORT": "the container port",
    "BROKER_DIRECTOR_URL": "required: the landscape's Director",
    "BROKER_DIRECTOR_CREDENTIALS_FILE": "where the chart mounts the Secret",
    "BROKER_DIRECTOR_MAX_CONCURRENCY": "a share per replica (test below)",
    "AGENT_BROKER_URL": "required (or broker.urlTemplate)",
    "AGENT_IDENTITY": "the pod's name (downward API)",
}


def _deployment_env(binaries: Binaries, chart: str, **values: str) -> dict[str, Any]:
    objects = render(
        binaries, chart, namespace=NAMESPACE[chart], values={**REQUIRED[chart], **values}
    )
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _readme_defaults() -> dict[str, str]:
    return dict(README_ROW.findall((REPO_ROOT / "README.md").read_text()))


def _same(chart_value: str, documented: str) -> bool:
    try:
        return math.isclose(float(chart_value), float(documented))
    except ValueError:
        return chart_value == documented


@pytest.mark.parametrize("chart", ["compass-broker", "compass-agent"])
def test_chart_defaults_are_the_documented_defaults(binaries: Binaries, chart: str) -> None:
    documented = _readme_defaults()
    env = _deployment_env(binaries, chart)
    compared = 0
    for name, value in env.items():
        if name in NOT_THE_DEFAULT:
            continue
        assert name in documented, f"{name} is set by the chart but not in the README's table"
        assert isinstance(value, str)
        assert _same(value, documented[name]), (
            f"{chart} sets {name}={value!r}, the README documents {documented[name]!r}"
        )
        compared += 1
    assert compared >= 10


def test_director_concurrency_is_the_documented_share_per_replica(binaries: Binaries) -> None:
    """docs/broker.md ("When Director is busy"): a quarter above the calls Director serves at
    once (10 for a Director serving 8), divided by the replicas."""
    env = _deployment_env(binaries, "compass-broker")
    objects = render(binaries, "compass-broker", namespace="kcp-system", values=BROKER_REQUIRED)
    (deployment,) = by_kind(objects, "Deployment")
    replicas = deployment["spec"]["replicas"]
    assert replicas == 2
    assert int(env["BROKER_DIRECTOR_MAX_CONCURRENCY"]) * replicas == math.ceil(8 * 1.25)
    broker_md = (REPO_ROOT / "docs" / "broker.md").read_text()
    assert "(10 for\na Director that serves 8)" in broker_md


@pytest.mark.parametrize("chart", ["compass-broker", "compass-agent"])
def test_extra_env_may_not_set_a_variable_the_chart_sets(binaries: Binaries, chart: str) -> None:
    env = _deployment_env(binaries, chart)
    assert len(env) >= 10
    for name in env:
        with pytest.raises(HelmError, match=f"extraEnv cannot set {name}"):
            _deployment_env(binaries, chart, **{"extraEnv[0].name": name, "extraEnv[0].value": "x"})


@pytest.mark.parametrize(
    ("chart", "name"),
    [("compass-broker", "BROKER_SWEEP_INTERVAL_SECONDS"), ("compass-agent", "AGENT_LEASE_NAME")],
)
def test_extra_env_values_are_strings_and_names_do_not_repeat(
    binaries: Binaries, chart: str, name: str
) -> None:
    # `--set` makes 300 a number: the API server would refuse it only at the real install.
    with pytest.raises(HelmError, match="/extraEnv/0/value"):
        _deployment_env(binaries, chart, **{"extraEnv[0].name": name, "extraEnv[0].value": "300"})
    with pytest.raises(HelmError, match=f"extraEnv sets {name} twice"):
        _deployment_env(
            binaries,
            chart,
            **{
                "extraEnv[0].name": name,
                "extraEnv[0].value": "a",
                "extraEnv[1].name": name,
                "extraEnv[1].value": "b",
            },
        )
    with pytest.raises(HelmError, match="/extraEnv/0"):
        _deployment_env(binaries, chart, **{"extraEnv[0].name": name})  # no value at all
    env = render(
        binaries,
        chart,
        namespace=NAMESPACE[chart],
        values={**REQUIRED[chart], "extraEnv[0].name": name, "extraEnv[0].value": "x300"},
    )
    (deployment,) = by_kind(env, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["env"][-1] == {"name": name, "value": "x300"}


def test_the_agent_needs_a_broker_url_source(binaries: Binaries) -> None:
    with pytest.raises(HelmError, match=r"broker.url or broker.urlTemplate is required"):
        render(binaries, "compass-agent", namespace="kyma-system", values={})
    template = {"broker.urlTemplate": "https://compass-broker.{kcp_domain}"}
    env = _deployment_env(binaries, "compass-agent", **{"broker.url": "", **template})
    assert env["AGENT_BROKER_URL_TEMPLATE"] == template["broker.urlTemplate"]


def test_the_agent_is_refused_outside_kyma_system(binaries: Binaries) -> None:
    with pytest.raises(HelmError, match="must be installed into kyma-system"):
        render(binaries, "compass-agent", namespace="default", values=AGENT_REQUIRED)
    assert render(
        binaries,
        "compass-agent",
        namespace="default",
        values={**AGENT_REQUIRED, "testing.anyNamespace": "true"},
    )
