"""Where the broker is and which runtime this is, without any per-cluster install value.

The module manifest is the same on every cluster of every landscape, so the agent finds both
at runtime, first source that answers wins:

broker URL
    1. `AGENT_BROKER_URL` — set by a Helm install (or a test); never by the module manifest
    2. ConfigMap `kyma-system/compass-agent`, key `brokerURL` — written by whoever runs a
       cluster the control plane does not manage (BYOC), or by an operator to override
    3. the `KCP_ADDR` environment variable lifecycle-manager gives its own `skr-webhook`
       Deployment in kyma-system (managed runtimes only), turned into a URL by
       `AGENT_BROKER_URL_TEMPLATE` (baked into the release: `https://compass-broker.{kcp_domain}`)
runtime ID
    1. the label `kyma-project.io/runtime-id` of the Kyma CR `kyma-system/default`
       (lifecycle-manager puts it on every managed runtime's Kyma)
    2. ConfigMap `kyma-system/compass-agent`, key `runtimeID` (BYOC)
    3. `AGENT_RUNTIME_ID` (Helm installs)

Everything here is pure: the reconciler reads the two objects and passes their raw JSON in.
Always holds: a resolved broker URL is https (or http only when given explicitly in the
environment, for local tests), has a host and no trailing slash; anything else is refused
with the source named, never half-used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

CONFIGMAP_NAME = "compass-agent"
BROKER_URL_KEY = "brokerURL"
RUNTIME_ID_KEY = "runtimeID"
SKR_WEBHOOK_NAME = "skr-webhook"
KCP_ADDR_ENV = "KCP_ADDR"


class Source(StrEnum):
    ENVIRONMENT = "environment"
    CONFIGMAP = "configmap"
    KCP_ADDR = "kcp-addr"
    KYMA_LABEL = "kyma-label"


@dataclass(frozen=True)
class Found:
    value: str
    source: Source


@dataclass(frozen=True)
class Discovered:
    """What the agent found; `problems` say why a source that was there was not used."""

    broker: Found | None
    runtime_id: Found | None
    problems: tuple[str, ...] = ()


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def configmap_data(raw: Mapping[str, Any] | None) -> Mapping[str, str]:
    data = _mapping(_mapping(raw).get("data"))
    return {str(k): v.strip() for k, v in data.items() if isinstance(v, str) and v.strip()}


def kcp_address(skr_webhook: Mapping[str, Any] | None) -> str | None:
    """`KCP_ADDR` (host:port) of the first container of lifecycle-manager's webhook with it."""
    template = _mapping(_mapping(_mapping(skr_webhook).get("spec")).get("template"))
    spec = _mapping(template.get("spec"))
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        env = _mapping(container).get("env")
        for raw in env if isinstance(env, list) else []:
            item = _mapping(raw)
            value = item.get("value")
            if item.get("name") == KCP_ADDR_ENV and isinstance(value, str) and value.strip():
                return value.strip()
    return None


def url_from_kcp_address(address: str, template: str) -> str:
    """`skr-events.cp.example.com:443` with `https://compass-broker.{kcp_domain}` →
    `https://compass-broker.cp.example.com`. Raises ValueError for an address without a domain."""
    host = urlsplit(f"//{address}").hostname or ""
    labels = host.split(".")
    if len(labels) < 3 or not all(labels):
        raise ValueError("KCP_ADDR is not host.domain:port")
    return template.format(kcp_host=host, kcp_domain=".".join(labels[1:]))


def checked_url(value: str, *, allow_http: bool) -> str:
    parts = urlsplit(value)
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"not an {'http(s)' if allow_http else 'https'} URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("a broker URL has no query, fragment or credentials")
    return value.rstrip("/")


def resolve(
    *,
    env_broker_url: str | None,
    env_runtime_id: str | None,
    url_template: str | None,
    configmap: Mapping[str, Any] | None,
    skr_webhook: Mapping[str, Any] | None,
    kyma_runtime_id: str | None,
) -> Discovered:
    problems: list[str] = []
    data = configmap_data(configmap)
    broker: Found | None = None
    if env_broker_url:
        # Settings validated it already; http is allowed there for local tests.
        broker = Found(env_broker_url.rstrip("/"), Source.ENVIRONMENT)
    elif BROKER_URL_KEY in data:
        try:
            broker = Found(checked_url(data[BROKER_URL_KEY], allow_http=False), Source.CONFIGMAP)
        except ValueError as e:
            problems.append(f"ConfigMap {CONFIGMAP_NAME} {BROKER_URL_KEY}: {e}")
    if broker is None:
        address = kcp_address(skr_webhook)
        if address is not None and url_template:
            try:
                url = checked_url(url_from_kcp_address(address, url_template), allow_http=False)
                broker = Found(url, Source.KCP_ADDR)
            except (ValueError, KeyError, IndexError) as e:
                problems.append(f"{SKR_WEBHOOK_NAME} {KCP_ADDR_ENV}: {e}")
    runtime: Found | None = None
    if kyma_runtime_id:
        runtime = Found(kyma_runtime_id, Source.KYMA_LABEL)
    elif RUNTIME_ID_KEY in data:
        runtime = Found(data[RUNTIME_ID_KEY], Source.CONFIGMAP)
    elif env_runtime_id:
        runtime = Found(env_runtime_id, Source.ENVIRONMENT)
    return Discovered(broker=broker, runtime_id=runtime, problems=tuple(problems))
