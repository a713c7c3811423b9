"""The agent's one settings object, read from environment variables prefixed `AGENT_`.

Always holds: every number is within the bounds declared on its field here (a duration is in
seconds, positive and at most a day or an hour); the broker URL is an absolute http(s) URL
without a trailing slash; the names of Kubernetes objects have the form the API server takes
(DNS-1123); `mtls` identity comes with a certificate and a key; the health address is
`host:port` with a port the kernel accepts. Files named by the settings are checked by
`startup_problems`, not here: a settings object may describe files that are made later.
Settings are passed down explicitly, never read from globals.
"""

from __future__ import annotations

import ipaddress
import ssl
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Self

from pydantic import AnyHttpUrl, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.retry_policy import RetryPolicy
from observability.settings_bounds import (
    NAMESPACE_MAX_LENGTH,
    NAMESPACE_PATTERN,
    OBJECT_NAME_MAX_LENGTH,
    OBJECT_NAME_PATTERN,
)
from observability.startup_checks import ca_file_problem, reason

DEFAULT_SA_TOKEN_FILE = Path("/var/run/secrets/compass-agent/token")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class IdentityMode(StrEnum):
    SERVICEACCOUNT = "serviceaccount"
    MTLS = "mtls"


class ModuleSignal(StrEnum):
    """What counts as 'the application-connector module is enabled'."""

    KYMA_SPEC = "kyma-spec"  # `application-connector` in the Kyma CR's spec.modules
    APPLICATIONCONNECTOR_CR = "applicationconnector-cr"  # an ApplicationConnector CR exists


# Upper bounds only catch a unit mistake (milliseconds for seconds) or a typo: an agent that
# would wait weeks to retry looks like an agent that hangs.
HOUR = 3600.0
DAY = 86400.0
Seconds = Annotated[float, Field(gt=0, le=DAY)]
ShortSeconds = Annotated[float, Field(gt=0, le=HOUR)]
Namespace = Annotated[str, Field(pattern=NAMESPACE_PATTERN, max_length=NAMESPACE_MAX_LENGTH)]
ObjectName = Annotated[str, Field(pattern=OBJECT_NAME_PATTERN, max_length=OBJECT_NAME_MAX_LENGTH)]


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENT_", extra="ignore", frozen=True)

    # --- the broker -----------------------------------------------------------------
    broker_url: AnyHttpUrl | None = Field(
        default=None,
        description="Base URL of the control-plane token broker; found at runtime when unset "
        "(ConfigMap compass-agent, then KCP_ADDR through the URL template).",
    )
    broker_url_template: str | None = Field(
        default=None,
        description="Broker URL made from lifecycle-manager's KCP_ADDR: {kcp_domain} is its "
        "host without the first label, {kcp_host} the whole host.",
    )
    broker_ca_bundle: Path | None = Field(
        default=None, description="CA bundle to verify the broker with; system CAs when unset."
    )
    broker_timeout: ShortSeconds = Field(default=30.0, description="Timeout of one broker request.")

    # --- identity -------------------------------------------------------------------
    identity_mode: IdentityMode = IdentityMode.SERVICEACCOUNT
    audience: str = Field(
        default="compass-broker", description="Audience of the ServiceAccount token.", min_length=1
    )
    sa_token_file: Path = Field(
        default=DEFAULT_SA_TOKEN_FILE,
        description="Projected ServiceAccount token; re-read for every request.",
    )
    service_account: ObjectName = Field(
        default="compass-agent",
        description="Own ServiceAccount, for TokenRequest when the token file is absent.",
    )
    service_account_namespace: Namespace | None = Field(
        default=None, description="Namespace of that ServiceAccount; AGENT_NAMESPACE when unset."
    )
    # The kubelet's and TokenRequest's minimum; a day is plenty for a token asked for again
    # before each use.
    token_request_seconds: int = Field(default=600, ge=600, le=int(DAY))
    client_cert_file: Path | None = None
    client_key_file: Path | None = None

    # --- the runtime ----------------------------------------------------------------
    namespace: Namespace = "kyma-system"
    kyma_name: ObjectName = "default"
    runtime_id: str | None = Field(
        default=None,
        description="Runtime ID when the Kyma CR has no kyma-project.io/runtime-id label (BYOC).",
    )
    module_signals: Annotated[list[ModuleSignal], NoDecode] = Field(
        default_factory=lambda: [ModuleSignal.KYMA_SPEC, ModuleSignal.APPLICATIONCONNECTOR_CR]
    )
    secret_name: ObjectName = "compass-agent-configuration"  # noqa: S105 - a name
    delete_secret_on_disable: bool = True
    kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig outside a pod; in-cluster config when unset."
    )

    # --- timing ---------------------------------------------------------------------
    handover_grace: Seconds = Field(
        default=300.0,
        description="A token younger than this is not replaced while the connection fails.",
    )
    runtime_agent_min_sync: Seconds = Field(
        default=16.0,
        description="compass-runtime-agent's APP_MINIMAL_COMPASS_SYNC_TIME plus a second: a fresh "
        "token is handed over (CompassConnection annotated) only this long after its last attempt.",
    )
    connection_grace: Seconds = Field(
        default=600.0,
        description="How long a written token may wait for a CompassConnection to appear.",
    )
    refusal_cadence: Seconds = Field(
        default=600.0, description="After 401/403/404/409, ask again only this often."
    )
    resync_period: Seconds = Field(
        default=600.0, description="Re-read everything this often even without watch events."
    )
    report_interval_seconds: Seconds = Field(
        default=300.0,
        description="Heartbeat of connection reports to the broker (the broker's "
        "nextReportAfterSeconds when shorter), ±20 % jitter; a changed state is reported at once.",
    )
    revoked_recheck_seconds: Seconds = Field(
        default=600.0,
        description="While the control plane has revoked the runtime: one token request this "
        "often (±20 % jitter) to learn that it is no longer revoked.",
    )
    backoff_base: ShortSeconds = 1.0
    backoff_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    backoff_cap: Seconds = 300.0

    # --- process --------------------------------------------------------------------
    health_address: str = "0.0.0.0:8080"  # probes and scrapes come from outside the pod
    lease_enabled: bool = True
    lease_name: ObjectName = "compass-agent"
    lease_duration: ShortSeconds = 15.0
    lease_renew: ShortSeconds = 5.0
    identity: str | None = Field(
        default=None, description="Lease holder identity; the pod name (HOSTNAME) when unset."
    )
    log_level: str = "INFO"

    @field_validator("log_level")
    @classmethod
    def _a_log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value

    @field_validator("health_address")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        split_address(value)  # refused at start, with the variable named, not when binding
        return value

    @model_validator(mode="before")
    @classmethod
    def _split_signals(cls, data: object) -> object:
        # A comma-separated environment value reads better than JSON for a list of words.
        if isinstance(data, dict):
            raw = data.get("module_signals")
            if isinstance(raw, str):
                data = {**data, "module_signals": [s.strip() for s in raw.split(",") if s.strip()]}
        return data

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.identity_mode is IdentityMode.MTLS and not (
            self.client_cert_file and self.client_key_file
        ):
            raise ValueError(
                "AGENT_IDENTITY_MODE=mtls needs AGENT_CLIENT_CERT_FILE and AGENT_CLIENT_KEY_FILE"
            )
        if self.broker_url_template is not None:
            try:
                self.broker_url_template.format(kcp_domain="d.example", kcp_host="h.d.example")
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(
                    "AGENT_BROKER_URL_TEMPLATE knows only {kcp_domain} and {kcp_host}"
                ) from e
        if not self.module_signals:
            raise ValueError("AGENT_MODULE_SIGNALS must name at least one signal")
        if self.lease_renew >= self.lease_duration:
            raise ValueError("AGENT_LEASE_RENEW must be shorter than AGENT_LEASE_DURATION")
        if self.backoff_base > self.backoff_cap:
            raise ValueError("AGENT_BACKOFF_BASE must not exceed AGENT_BACKOFF_CAP")
        return self

    @property
    def broker_base(self) -> str | None:
        return str(self.broker_url).rstrip("/") if self.broker_url is not None else None

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(base=self.backoff_base, factor=self.backoff_factor, cap=self.backoff_cap)


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets; an empty host is every address) as (host, port); raises
    ValueError saying what is wrong."""
    host, colon, port_text = address.rpartition(":")
    if not colon or not port_text.isdecimal():
        raise ValueError("must be host:port, e.g. 0.0.0.0:8080")
    port = int(port_text)
    if port > 65535:
        raise ValueError("the port must be 0 to 65535")
    host = host.removeprefix("[").removesuffix("]")
    if host and host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError("the host must be an IPv4 or IPv6 address, or localhost") from None
    return host or "0.0.0.0", port  # noqa: S104 - probes and scrapes come from outside the pod


def startup_problems(settings: AgentSettings) -> list[str]:
    """What the agent needs beyond well-typed values, each problem on one line naming its
    variable: the files it reads the broker's CA and its client certificate from. Contacts
    nothing; the kubeconfig is checked where it is loaded."""
    problems: list[str] = []
    if settings.broker_ca_bundle is not None and (
        why := ca_file_problem(settings.broker_ca_bundle)
    ):
        problems.append(f"AGENT_BROKER_CA_BUNDLE: {why}")
    if (
        settings.identity_mode is IdentityMode.MTLS
        and settings.client_cert_file is not None
        and settings.client_key_file is not None
    ):
        try:
            ssl.create_default_context().load_cert_chain(
                str(settings.client_cert_file), str(settings.client_key_file)
            )
        except (OSError, ssl.SSLError, ValueError) as exc:
            problems.append(
                f"AGENT_CLIENT_CERT_FILE, AGENT_CLIENT_KEY_FILE: {settings.client_cert_file}, "
                f"{settings.client_key_file}: no certificate and matching key can be read from "
                f"them ({reason(exc)})"
            )
    return problems
