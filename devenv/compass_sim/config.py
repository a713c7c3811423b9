"""The simulator's configuration (one immutable pydantic model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from .faults import Faults
from .operations import READ_SCOPE, WRITE_SCOPE

__all__ = ["CsrSubject", "SimConfig"]


class CsrSubject(BaseModel):
    """The fixed part of the subject Connector expects in a CSR (CN = runtime ID)."""

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
    # None: every tenant is accepted; otherwise other tenants get error 25.
    tenants: frozenset[str] | None = None
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
