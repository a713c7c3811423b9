"""The simulator's configuration (one immutable pydantic model)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from .faults import Faults
from .operations import READ_SCOPE, WRITE_SCOPE

__all__ = ["ConsumerType", "CsrSubject", "GlobalAccount", "SimConfig", "Subaccount"]


class ConsumerType(StrEnum):
    """How the gateway in front of Director presents the caller (the JWT's `consumerType`)."""

    # compass-manager's and the broker's client: Director labels what it registers as Kyma.
    INTEGRATION_SYSTEM = "Integration System"
    TECHNICAL_CLIENT = "Technical Client"


class Subaccount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # The tenant's `region` label; None: the tenant has none (Director then labels region "").
    region: str | None = None


class GlobalAccount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    subaccounts: dict[str, Subaccount] = Field(default_factory=dict)


class CsrSubject(BaseModel):
    """The fixed part of the subject Connector expects in a CSR (CN = the SystemAuth's ID)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    organization: str = "compass-sim"
    organizational_unit: str = "kyma-runtimes"
    locality: str = "Waldorf"
    province: str = "Waldorf"
    country: str = "DE"

    def render(self, common_name: str) -> str:
        """The subject string in Connector's order: O, OU, L, ST, C, CN."""
        return (
            f"O={self.organization},OU={self.organizational_unit},L={self.locality},"
            f"ST={self.province},C={self.country},CN={common_name}"
        )


class SimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    client_id: str = Field(min_length=1)
    client_secret: SecretStr
    # Scopes the client may request; a token carries only the scopes requested.
    client_scopes: tuple[str, ...] = (READ_SCOPE, WRITE_SCOPE)
    # The tenants Director knows, as its tenant fetcher synced them: global account ID ->
    # its subaccounts. None (permissive, for benches and demos): every tenant is a global
    # account and a `global_subaccount_id` seen for the first time becomes a subaccount of
    # the caller, as with Director's on-demand tenant fetching. Otherwise an unknown tenant
    # gets HTTP 400 code 25, an unknown subaccount code 20.
    accounts: dict[str, GlobalAccount] | None = None
    # Shorthand for `accounts` without subaccounts (merged into `accounts`).
    tenants: frozenset[str] | None = None
    consumer_type: ConsumerType = ConsumerType.INTEGRATION_SYSTEM
    access_token_ttl_seconds: float = Field(default=3600.0, gt=0)
    ott_ttl_seconds: float = Field(default=3600.0, gt=0)
    # Lifetime of the token `configuration` returns for signing the CSR.
    csr_token_ttl_seconds: float = Field(default=300.0, gt=0)
    certificate_validity_seconds: float = Field(default=90 * 24 * 3600.0, gt=0)
    # Director's limit for `runtimes(first:)` (the real service allows 1..200).
    max_page_size: int = Field(default=200, ge=1)
    # Director adds label isNormalized="true" to every runtime it registers or updates.
    add_normalized_label: bool = True
    # Base URL put into connectorURL / directorURL (default: the listening URL).
    public_url: str | None = None
    csr_subject: CsrSubject = CsrSubject()
    state_file: Path | None = None
    state_save_interval_seconds: float = Field(default=0.5, gt=0)
    request_log_size: int = Field(default=10_000, ge=1)
    initial_faults: Faults = Faults()
    # Seconds the listener may take to finish in-flight requests when it stops.
    graceful_shutdown_seconds: int = Field(default=2, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _merge_tenants(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("tenants"):
            return data
        accounts = dict(data.get("accounts") or {})
        for tenant in data["tenants"]:
            accounts.setdefault(tenant, GlobalAccount())
        return {**data, "accounts": accounts}

    @model_validator(mode="after")
    def _check_accounts(self) -> SimConfig:
        # A tenant row has one parent at most, and IDs are unique across accounts and subaccounts.
        seen: set[str] = set(self.accounts or {})
        for account in (self.accounts or {}).values():
            for subaccount in account.subaccounts:
                if subaccount in seen:
                    raise ValueError(f"tenant {subaccount!r} is listed twice")
                seen.add(subaccount)
        return self
