"""The broker's configuration: one settings object, read from `BROKER_*` environment variables.

Every field has a default that is safe for production except the Director endpoint and
credentials, which must be given. README.md lists every field; a test keeps them in sync.
Settings are passed down explicitly; nothing reads the environment after start-up. A use case
gets only its concern's settings: a small frozen group built from `Settings` in the wiring
(`Settings.registration_settings` and the like), its fields named as in `Settings`.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from observability.settings_bounds import (
    NAMESPACE_MAX_LENGTH,
    NAMESPACE_PATTERN,
    OBJECT_NAME_MAX_LENGTH,
    OBJECT_NAME_PATTERN,
)
from observability.startup_checks import ca_file_problem

IdentityMode = Literal["tokenreview", "jwks", "xfcc"]
ModulePolicy = Literal["required", "ignored"]
DisabledPolicy = Literal["keep", "unregister"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
Namespace = Annotated[str, Field(pattern=NAMESPACE_PATTERN, max_length=NAMESPACE_MAX_LENGTH)]
ObjectName = Annotated[str, Field(pattern=OBJECT_NAME_PATTERN, max_length=OBJECT_NAME_MAX_LENGTH)]

# Upper bounds are generous: they only catch a unit mistake (milliseconds for seconds) or a typo
# before it becomes a broker that never retries, never sweeps or never gives up on a call.
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
WEEK = 7 * DAY


@dataclass(frozen=True)
class ModuleSettings:
    """Which module a Kyma must have on, and what happens when it is turned off."""

    module_name: str
    module_required: bool
    module_disabled_policy: DisabledPolicy


@dataclass(frozen=True)
class ReportSettings:
    """Connection reports: how often agents report, and how their records are judged."""

    report_interval_seconds: int
    report_min_interval_seconds: float
    report_refresh_seconds: float
    report_stale_seconds: float
    connect_deadline_seconds: float


@dataclass(frozen=True)
class RegistrationSettings:
    """Registering a runtime: its mapping's claim, Director's labels and call budget."""

    kcp_namespace: str
    registration_claim_seconds: float
    tenant_recheck_seconds: float
    runtime_id_label: str
    managed_by_label_value: str
    director_timeout_seconds: float
    director_queue_timeout_seconds: float


@dataclass(frozen=True)
class ReconcilerSettings:
    """The leader's loops: sweeps, connection checks, unregistration and label sync."""

    kcp_namespace: str
    sweep_interval_seconds: float
    connection_check_interval_seconds: float
    runtime_id_label: str
    managed_by_label_value: str
    module: ModuleSettings
    reports: ReportSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BROKER_", extra="ignore", frozen=True)

    # --- Compass Director --------------------------------------------------------------------
    director_url: str = Field(
        default="", description="Director GraphQL endpoint, e.g. https://compass/director/graphql."
    )
    director_credentials_file: Path | None = Field(
        default=None,
        description="File in compass-manager's format `data: {client_id, client_secret, "
        "tokens_endpoint}` (YAML or JSON). Read again when it changes (looked at every 5 s, and "
        "at once after the token endpoint refused the credentials), so a rotated Secret needs "
        "no restart; a file that became unreadable or invalid keeps the last good credentials "
        "in force (one ERROR line).",
    )
    director_timeout_seconds: float = Field(
        default=10.0, description="Timeout of one Director call.", gt=0, le=5 * MINUTE
    )
    director_max_concurrency: int = Field(
        default=8,
        description="Global limit of Director calls in flight per replica.",
        ge=1,
        le=1000,
    )
    first_contacts_in_progress: int = Field(
        default=64,
        description="Requests of runtimes this replica has not proven recently that are worked "
        "on at once; the others wait in arrival order in front of the app, costing no CPU "
        "(a herd of first contacts must not stall the event loop).",
        ge=1,
        le=10_000,
    )
    first_contacts_per_runtime: int = Field(
        default=2,
        description="Places at the first-contact limit, and identity checks in flight, one "
        "runtime ID may hold at once; its further requests wait in a queue of their own or are "
        "answered 503 at once: no runtime ID (an attacker's, a stalled cluster's) crowds out "
        "the fleet.",
        ge=1,
        le=1000,
    )
    director_queue_timeout_seconds: float = Field(
        default=10.0,
        description="Longest estimated wait for Director capacity a request is admitted with; "
        "beyond it the request is answered 503 with Retry-After = the start of its reservation. "
        "Keep it well below the agent's timeout (30 s): a request may wait up to twice this long.",
        gt=0,
        le=5 * MINUTE,
    )
    request_deadline_seconds: float = Field(
        default=25.0,
        description="How long after a token request arrives its answer must be on its way: the "
        "request is admitted to Director only when its wait and its calls end by then, counting "
        "the time it already spent in the broker, and its token is requested only when the "
        "answer can be back by then; otherwise it is answered 503 capacity-booked with a "
        "reservation. Keep it a few seconds below the agent's timeout (30 s).",
        gt=0,
        le=5 * MINUTE,
    )
    director_scope: str = Field(
        default="runtime:read runtime:write", description="OAuth scope requested."
    )
    managed_by_label_value: str = Field(
        default="compass-manager",
        description="Value of Director label `director_connection_managed_by` (kept as "
        "compass-manager set it, so existing selectors keep matching).",
    )
    runtime_id_label: str = Field(
        default="kyma_runtime_id",
        description="Director label holding the Kyma runtime ID; looked up before registering.",
    )

    # --- identity ----------------------------------------------------------------------------
    identity_mode: IdentityMode = Field(
        default="tokenreview", description="How callers prove their cluster: tokenreview|jwks|xfcc."
    )
    audience: str = Field(
        default="compass-broker",
        description="Audience the caller's ServiceAccount token must carry.",
        min_length=1,
    )
    allowed_service_accounts: str = Field(
        default="kyma-system/compass-agent",
        description="Comma-separated `namespace/name` ServiceAccounts allowed to ask.",
    )
    jwks_issuer_url: str = Field(
        default="",
        description="jwks mode: fixed issuer base URL (`<url>/openid/v1/jwks`); empty = fetch "
        "through the runtime kubeconfig and accept the cluster's own issuer.",
    )
    byoc_enrolment: bool = Field(
        default=True,
        description="tokenreview, and jwks without BROKER_JWKS_ISSUER_URL: a runtime without a "
        "kubeconfig Secret enrols its ServiceAccount issuer by double opt-in (pending on the "
        "mapping until an operator approves it).",
    )
    issuer_ca_file: Path | None = Field(
        default=None,
        description="PEM CA certificates trusted, besides the public ones, for HTTPS to issuers "
        "(enrolled issuers, BROKER_JWKS_ISSUER_URL).",
    )
    xfcc_trusted: bool = Field(
        default=False,
        description="xfcc mode: trust `X-Forwarded-Client-Cert` (only behind the gateway).",
    )
    xfcc_deny_list_file: Path | None = Field(
        default=None,
        description="xfcc mode: file of revoked client certificates, one SHA-256 hash (the XFCC "
        "`Hash=` value) per line, `#` comments; re-read when it changes.",
    )
    identity_failure_burst: int = Field(
        default=10,
        description="Failed identity proofs one runtime may cost in a burst (TokenReviews, key "
        "checks); beyond its budget its unproven requests get 429 with no request made. A token "
        "that proved the runtime recently always passes.",
        ge=1,
        le=10_000,
    )
    identity_failures_per_minute: float = Field(
        default=10.0,
        description="Sustained failed identity proofs per runtime per minute (the budget's "
        "refill).",
        gt=0,
        le=60_000,
    )
    runtime_unreachable_seconds: float = Field(
        default=10.0,
        description="A runtime API server that did not answer (timeout, no connection) is "
        "not asked again for this long: its runtimes' checks are answered 503 at once.",
        ge=0,
        le=HOUR,
    )
    identity_cache_max_seconds: float = Field(
        default=600.0,
        description="Upper bound for caching a positive TokenReview verdict.",
        ge=0,
        le=DAY,
    )
    runtime_access_cache_seconds: float = Field(
        default=300.0,
        description="How long a runtime kubeconfig read from KCP is reused.",
        ge=0,
        le=DAY,
    )
    runtime_kubeconfig_secret_pattern: str = Field(
        default="kubeconfig-{runtime_id}",
        description="Name of a runtime's kubeconfig Secret in the KCP namespace; `{runtime_id}` "
        "is the lower-cased runtime ID. Found by this exact name only.",
        pattern=r"^[a-z0-9.-]*\{runtime_id\}[a-z0-9.-]*$",
    )

    # --- policy ------------------------------------------------------------------------------
    module_name: str = Field(
        default="application-connector", description="Module that must be on.", min_length=1
    )
    module_policy: ModulePolicy = Field(
        default="required",
        description="`required`: module must be in spec.modules or status.modules; `ignored`.",
    )
    module_disabled_policy: DisabledPolicy = Field(
        default="keep",
        description="When the module is turned off: keep the Director registration or unregister.",
    )

    # --- limits ------------------------------------------------------------------------------
    rate_limit_burst: int = Field(
        default=5, description="Token issues per runtime in a burst.", ge=1, le=10_000
    )
    rate_limit_per_minute: float = Field(
        default=6.0,
        description="Sustained token issues per runtime per minute.",
        gt=0,
        le=60_000,
    )
    breaker_failure_threshold: int = Field(
        default=5,
        description="Consecutive retryable Director failures that open the breaker (an internal "
        "error, code 10, counts once per runtime in a run).",
        ge=1,
        le=1000,
    )
    breaker_open_seconds: float = Field(
        default=5.0,
        description="How long the breaker stays open before one probe: at most one call per "
        "this many seconds reaches a Compass that is down, and its return is noticed this soon.",
        gt=0,
        le=HOUR,
    )
    retry_after_jitter_seconds: float = Field(
        default=5.0, description="Random extra seconds added to Retry-After.", ge=0, le=HOUR
    )
    report_min_interval_seconds: float = Field(
        default=10.0,
        description="At most one connection report per runtime per this many seconds (per "
        "replica); more get 429.",
        gt=0,
        le=DAY,
    )
    report_interval_seconds: int = Field(
        default=300,
        description="The heartbeat the broker asks agents for (`nextReportAfterSeconds`).",
        ge=1,
        le=int(DAY),
    )
    report_refresh_seconds: float = Field(
        default=3600.0,
        description="An unchanged report is written to the mapping only when the recorded "
        "`lastReportAt` is older than this.",
        gt=0,
        le=WEEK,
    )
    report_stale_seconds: float = Field(
        default=7200.0,
        description="A recorded last report older than this sets condition `ReportsStale`; must "
        "exceed BROKER_REPORT_REFRESH_SECONDS + BROKER_REPORT_INTERVAL_SECONDS.",
        gt=0,
        le=4 * WEEK,
    )
    connect_deadline_seconds: float = Field(
        default=900.0,
        description="A runtime given a token that has not reported Connected this long after it "
        "gets `Connected=False` reason `NotConnectedAfterToken`.",
        gt=0,
        le=WEEK,
    )
    connection_check_interval_seconds: float = Field(
        default=60.0,
        description="Period of the leader's check of every mapping for stale reports and "
        "runtimes not connected after a token.",
        gt=0,
        le=DAY,
    )
    registration_claim_seconds: float = Field(
        default=60.0,
        description="Lifetime of a registration claim; a crashed holder's expires.",
        gt=0,
        le=DAY,
    )
    tenant_recheck_seconds: float = Field(
        default=900.0,
        gt=0,
        le=WEEK,
        description="After Director refused a Kyma's global account or subaccount as unknown, "
        "ask it again only this often (or at once when the Kyma's labels change).",
    )

    # --- Kubernetes / control plane ----------------------------------------------------------
    kcp_namespace: Namespace = Field(
        default="kcp-system", description="Namespace of Kyma CRs and mappings."
    )
    cache_stale_seconds: float = Field(
        default=600.0,
        description="Readiness fails when the Kyma or mapping watch has not heard from the API "
        "server (event, bookmark or list) for this long.",
        gt=0,
        le=DAY,
    )
    sweep_interval_seconds: float = Field(
        default=300.0,
        description="Period of the reconciler's full sweep over mappings.",
        gt=0,
        le=WEEK,
    )
    leader_election: bool = Field(default=True, description="Run the reconciler only as leader.")
    lease_name: ObjectName = Field(
        default="compass-broker-leader", description="Lease for leader election."
    )
    lease_namespace: Namespace = Field(default="kcp-system", description="Namespace of the Lease.")
    lease_duration_seconds: float = Field(
        default=15.0, description="Lease duration.", gt=0, le=HOUR
    )
    lease_renew_seconds: float = Field(
        default=5.0,
        description="Lease renew period; shorter than BROKER_LEASE_DURATION_SECONDS.",
        gt=0,
        le=HOUR,
    )
    reconciler_enabled: bool = Field(default=True, description="Run the reconciler at all.")

    # --- server ------------------------------------------------------------------------------
    host: str = Field(
        default="0.0.0.0",  # noqa: S104 (a server)
        description="Listen address: an IPv4 or IPv6 address, or localhost.",
    )
    port: int = Field(
        default=8080, description="Listen port (0 = any free port, logged).", ge=0, le=65535
    )
    log_level: str = Field(default="INFO", description="Log level.")
    api_docs: bool = Field(
        default=False,
        description="Serve the OpenAPI description at /openapi.json (no Swagger UI or ReDoc "
        "pages, nothing loaded from elsewhere). Off: the API port answers only the API, probes "
        "and metrics.",
    )

    @field_validator("log_level")
    @classmethod
    def _a_log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value

    @field_validator("host")
    @classmethod
    def _an_address_to_listen_on(cls, value: str) -> str:
        # A name would be resolved only when the socket is bound, and fail there with a
        # traceback; an address is checked here, with the variable named.
        if value != "localhost":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError("must be an IPv4 or IPv6 address, or localhost") from None
        return value

    @field_validator("allowed_service_accounts")
    @classmethod
    def _service_accounts_are_namespace_slash_name(cls, value: str) -> str:
        parse_service_accounts(value)  # refused at start, not at the first request
        return value

    @model_validator(mode="after")
    def _lease_renewed_before_it_lapses(self) -> Settings:
        # A renewal after the lease ran out lets another replica take it between the two: two
        # leaders, each unregistering and relabelling runtimes.
        if self.lease_renew_seconds >= self.lease_duration_seconds:
            raise ValueError(
                f"BROKER_LEASE_RENEW_SECONDS ({self.lease_renew_seconds:g}) must be shorter than "
                f"BROKER_LEASE_DURATION_SECONDS ({self.lease_duration_seconds:g})"
            )
        return self

    @model_validator(mode="after")
    def _claim_outlives_a_registration(self) -> Settings:
        # A claim shorter than one registration attempt could lapse mid-call and let another
        # replica register too: refuse such a configuration at start, not at the first request.
        budget = 3 * self.director_timeout_seconds + self.director_queue_timeout_seconds
        if self.registration_claim_seconds <= budget:
            raise ValueError(
                f"BROKER_REGISTRATION_CLAIM_SECONDS ({self.registration_claim_seconds:g}) must "
                f"exceed 3 x BROKER_DIRECTOR_TIMEOUT_SECONDS + "
                f"BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS ({budget:g})"
            )
        return self

    @model_validator(mode="after")
    def _reports_fit_together(self) -> Settings:
        # The recorded lastReportAt lags the last report by up to the refresh interval plus one
        # heartbeat: a stale bound within that would flag runtimes that report fine.
        lag = self.report_refresh_seconds + self.report_interval_seconds
        if self.report_stale_seconds <= lag:
            raise ValueError(
                f"BROKER_REPORT_STALE_SECONDS ({self.report_stale_seconds:g}) must exceed "
                f"BROKER_REPORT_REFRESH_SECONDS + BROKER_REPORT_INTERVAL_SECONDS ({lag:g})"
            )
        if self.report_interval_seconds < self.report_min_interval_seconds:
            raise ValueError(
                "BROKER_REPORT_INTERVAL_SECONDS must not be below "
                "BROKER_REPORT_MIN_INTERVAL_SECONDS: agents would be asked to report too often"
            )
        if self.xfcc_deny_list_file is not None and self.identity_mode != "xfcc":
            raise ValueError("BROKER_XFCC_DENY_LIST_FILE is for BROKER_IDENTITY_MODE=xfcc only")
        return self

    def allowed_service_account_set(self) -> frozenset[tuple[str, str]]:
        return parse_service_accounts(self.allowed_service_accounts)

    def module_settings(self) -> ModuleSettings:
        return ModuleSettings(
            module_name=self.module_name,
            module_required=self.module_policy == "required",
            module_disabled_policy=self.module_disabled_policy,
        )

    def report_settings(self) -> ReportSettings:
        return ReportSettings(
            report_interval_seconds=self.report_interval_seconds,
            report_min_interval_seconds=self.report_min_interval_seconds,
            report_refresh_seconds=self.report_refresh_seconds,
            report_stale_seconds=self.report_stale_seconds,
            connect_deadline_seconds=self.connect_deadline_seconds,
        )

    def registration_settings(self) -> RegistrationSettings:
        return RegistrationSettings(
            kcp_namespace=self.kcp_namespace,
            registration_claim_seconds=self.registration_claim_seconds,
            tenant_recheck_seconds=self.tenant_recheck_seconds,
            runtime_id_label=self.runtime_id_label,
            managed_by_label_value=self.managed_by_label_value,
            director_timeout_seconds=self.director_timeout_seconds,
            director_queue_timeout_seconds=self.director_queue_timeout_seconds,
        )

    def reconciler_settings(self) -> ReconcilerSettings:
        return ReconcilerSettings(
            kcp_namespace=self.kcp_namespace,
            sweep_interval_seconds=self.sweep_interval_seconds,
            connection_check_interval_seconds=self.connection_check_interval_seconds,
            runtime_id_label=self.runtime_id_label,
            managed_by_label_value=self.managed_by_label_value,
            module=self.module_settings(),
            reports=self.report_settings(),
        )


def parse_service_accounts(text: str) -> frozenset[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        namespace, _, name = item.partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(f"{item!r} is not namespace/name")
        out.add((namespace, name))
    return frozenset(out)


def http_url_problem(url: str) -> str | None:
    """Why `url` is no absolute http(s) URL with a host, or None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an absolute http(s) URL"
    return None


def serving_problems(settings: Settings) -> list[str]:
    """What serving needs beyond well-typed values, each problem on one line naming its
    variable: Director's URL and credentials (compass-manager's file, read and parsed here),
    files the identity modes read. Checked before anything starts, so a broker that cannot work
    says why and exits instead of failing at the first request. Contacts nothing."""
    problems: list[str] = []
    if not settings.director_url:
        problems.append(
            "BROKER_DIRECTOR_URL is not set: Director's GraphQL endpoint, "
            "e.g. https://compass-gateway.example/director/graphql"
        )
    elif (why := http_url_problem(settings.director_url)) is not None:
        problems.append(f"BROKER_DIRECTOR_URL: {why} (got {settings.director_url[:80]!r})")
    if settings.director_credentials_file is None:
        problems.append(
            "BROKER_DIRECTOR_CREDENTIALS_FILE is not set: compass-manager's credentials file, "
            "`data: {client_id, client_secret, tokens_endpoint}`"
        )
    else:
        try:
            load_director_credentials(settings.director_credentials_file)
        except CredentialsInvalid as exc:
            problems.append(f"BROKER_DIRECTOR_CREDENTIALS_FILE: {exc}")
    if settings.issuer_ca_file is not None and (why := ca_file_problem(settings.issuer_ca_file)):
        problems.append(f"BROKER_ISSUER_CA_FILE: {why}")
    if settings.xfcc_deny_list_file is not None:
        try:
            settings.xfcc_deny_list_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(
                f"BROKER_XFCC_DENY_LIST_FILE: {settings.xfcc_deny_list_file}: cannot be read "
                f"({_os_reason(exc)})"
            )
    return problems


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@dataclass(frozen=True)
class DirectorCredentials:
    client_id: str
    client_secret: str
    tokens_endpoint: str

    def __repr__(self) -> str:  # the secret must never reach a log line
        return f"DirectorCredentials(client_id={self.client_id!r}, tokens_endpoint=...)"


class CredentialsInvalid(ValueError):
    """compass-manager's credentials file cannot be used; the message names the file and what
    is wrong with it, never a value from it (it holds the client secret)."""


def load_director_credentials(path: Path) -> DirectorCredentials:
    """Reads compass-manager's file: `data: {client_id, client_secret, tokens_endpoint}`.

    YAML is a superset of JSON, so one parser reads both. Values are plain strings: a mounted
    Secret is already decoded. Raises `CredentialsInvalid` for a file that is missing, unreadable
    or not in that format.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsInvalid(f"{path}: cannot be read ({_os_reason(exc)})") from None
    try:
        doc = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        # The parser's message quotes the line, which may be the secret's.
        raise CredentialsInvalid(f"{path}: neither YAML nor JSON") from None
    if not isinstance(doc, dict):
        raise CredentialsInvalid(
            f"{path}: not a mapping; expected `data: {{client_id, client_secret, tokens_endpoint}}`"
        )
    data = doc.get("data", doc)
    if isinstance(data, str):  # a JSON document embedded as a string
        try:
            data = json.loads(data)
        except ValueError:
            raise CredentialsInvalid(f"{path}: `data` is a string but not JSON") from None
    if not isinstance(data, dict):
        raise CredentialsInvalid(f"{path}: `data` is not a mapping")
    missing = [k for k in ("client_id", "client_secret", "tokens_endpoint") if not data.get(k)]
    if missing:
        raise CredentialsInvalid(f"{path}: missing {', '.join(missing)}")
    if (why := http_url_problem(str(data["tokens_endpoint"]))) is not None:
        raise CredentialsInvalid(f"{path}: tokens_endpoint is {why}")
    return DirectorCredentials(
        client_id=str(data["client_id"]),
        client_secret=str(data["client_secret"]),
        tokens_endpoint=str(data["tokens_endpoint"]),
    )
