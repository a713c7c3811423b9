"""`agent.discovery.resolve`: where the broker is and which runtime this is, source by source."""

from __future__ import annotations

from typing import Any

import pytest

from agent.discovery import Found, Source, resolve, url_from_kcp_address

TEMPLATE = "https://compass-broker.{kcp_domain}"


def configmap(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "compass-agent"}, "data": data}


def skr_webhook(kcp_addr: str | None) -> dict[str, Any]:
    env = [{"name": "OTHER", "value": "x"}]
    if kcp_addr is not None:
        env.append({"name": "KCP_ADDR", "value": kcp_addr})
    return {"spec": {"template": {"spec": {"containers": [{"name": "server", "env": env}]}}}}


def found(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "env_broker_url": None,
        "env_runtime_id": None,
        "url_template": TEMPLATE,
        "configmap": None,
        "skr_webhook": None,
        "kyma_runtime_id": None,
    }
    return resolve(**(args | kwargs))


def test_environment_wins_over_configmap_and_kcp_addr() -> None:
    got = found(
        env_broker_url="http://127.0.0.1:8443/",
        configmap=configmap(brokerURL="https://cm.example.com"),
        skr_webhook=skr_webhook("skr-events.kcp.example.com:443"),
    )
    assert got.broker == Found("http://127.0.0.1:8443", Source.ENVIRONMENT)


def test_configmap_wins_over_kcp_addr() -> None:
    got = found(
        configmap=configmap(brokerURL="https://broker.byoc.example.com/"),
        skr_webhook=skr_webhook("skr-events.kcp.example.com:443"),
    )
    assert got.broker == Found("https://broker.byoc.example.com", Source.CONFIGMAP)


def test_kcp_addr_through_the_template_for_managed_runtimes() -> None:
    got = found(skr_webhook=skr_webhook("skr-events.cp.dev.example.com:443"))
    assert got.broker == Found("https://compass-broker.cp.dev.example.com", Source.KCP_ADDR)
    assert got.problems == ()


def test_nothing_anywhere_is_unknown_not_a_guess() -> None:
    assert found().broker is None
    assert found(skr_webhook=skr_webhook(None)).broker is None
    # KCP_ADDR without a template: the release did not say how to make a URL of it.
    assert found(url_template=None, skr_webhook=skr_webhook("a.b.example.com:443")).broker is None


@pytest.mark.parametrize(
    "bad",
    [
        "http://broker.example.com",  # only https from a ConfigMap
        "https://user:pw@broker.example.com",
        "https://broker.example.com/?x=1",
        "broker.example.com",
        "https://",
    ],
)
def test_a_bad_configmap_url_is_refused_with_the_source_named_and_falls_through(bad: str) -> None:
    got = found(
        configmap=configmap(brokerURL=bad), skr_webhook=skr_webhook("skr.kcp.example.com:443")
    )
    assert got.broker == Found("https://compass-broker.kcp.example.com", Source.KCP_ADDR)
    assert len(got.problems) == 1
    assert got.problems[0].startswith("ConfigMap compass-agent brokerURL")
    assert "pw" not in got.problems[0]


@pytest.mark.parametrize("address", ["localhost:443", "kcp:443", "a..b:443", ":443"])
def test_kcp_addr_without_a_domain_is_refused(address: str) -> None:
    got = found(skr_webhook=skr_webhook(address))
    assert got.broker is None
    assert got.problems
    assert "KCP_ADDR" in got.problems[0]


def test_url_from_kcp_address_knows_host_and_domain() -> None:
    assert url_from_kcp_address("x.y.example.com:8443", "https://b.{kcp_domain}") == (
        "https://b.y.example.com"
    )
    assert url_from_kcp_address("x.y.example.com", "https://{kcp_host}/broker") == (
        "https://x.y.example.com/broker"
    )


def test_runtime_id_label_then_configmap_then_environment() -> None:
    cm = configmap(runtimeID="rt-cm")
    assert found(kyma_runtime_id="rt-label", configmap=cm, env_runtime_id="rt-env").runtime_id == (
        Found("rt-label", Source.KYMA_LABEL)
    )
    assert found(configmap=cm, env_runtime_id="rt-env").runtime_id == Found(
        "rt-cm", Source.CONFIGMAP
    )
    assert found(env_runtime_id="rt-env").runtime_id == Found("rt-env", Source.ENVIRONMENT)
    assert found(configmap=configmap(runtimeID="  ")).runtime_id is None


def test_hostile_shapes_read_as_absent() -> None:
    odd: list[Any] = [
        {"data": ["not", "a", "map"]},
        {"data": {"brokerURL": 7}},
        {"spec": {"template": {"spec": {"containers": "x"}}}},
        {"spec": {"template": {"spec": {"containers": [{"env": [{"name": "KCP_ADDR"}]}]}}}},
    ]
    for raw in odd:
        got = found(configmap=raw, skr_webhook=raw)
        assert got.broker is None
        assert got.runtime_id is None
