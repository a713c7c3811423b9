"""Typed views of the Kubernetes objects the agent reads, parsed from raw JSON at the edge.

Always holds: parsing never raises on odd input (a missing field reads as "unknown", which the
decision treats conservatively); nothing here holds the token itself — a `TokenRecord` is what
the secret's annotations say *about* the token, plus its SHA-256 (for connection reports). No
Kubernetes or HTTP imports.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

MODULE_NAME = "application-connector"
RUNTIME_ID_LABEL = "kyma-project.io/runtime-id"
GLOBAL_ACCOUNT_LABEL = "kyma-project.io/global-account-id"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "compass-agent"
ANNOTATION_PREFIX = "compass-agent.kyma-project.io/"
EXPIRES_AT_ANNOTATION = ANNOTATION_PREFIX + "token-expires-at"
ISSUED_AT_ANNOTATION = ANNOTATION_PREFIX + "token-issued-at"
COMPASS_RUNTIME_ID_ANNOTATION = ANNOTATION_PREFIX + "compass-runtime-id"
# On the secret: the CompassConnection's `status.connectionStatus.lastSync` when the token was
# written ("" when there was none). compass-runtime-agent stamps lastSync on every attempt, so a
# different lastSync later means it has tried this token.
CONNECTION_SEEN_ANNOTATION = ANNOTATION_PREFIX + "connection-last-sync-at-write"
# On the CompassConnection: the issue time of the token the agent asked compass-runtime-agent to
# try. Changing it is an update event, on which compass-runtime-agent reconciles at once instead
# of at its next resync (180 s in the module).
HANDED_OVER_ANNOTATION = ANNOTATION_PREFIX + "token-handed-over"

SECRET_KEYS = ("CONNECTOR_URL", "TOKEN", "RUNTIME_ID", "TENANT")


class ConnectionState(StrEnum):
    """`status.connectionState` of compass-runtime-agent's CompassConnection."""

    CONNECTED = "Connected"
    CONNECTION_FAILED = "ConnectionFailed"
    CONNECTION_MAINTENANCE_FAILED = "ConnectionMaintenanceFailed"
    SYNCHRONIZATION_FAILED = "SynchronizationFailed"
    RESOURCE_APPLICATION_FAILED = "ResourceApplicationFailed"
    METADATA_UPDATE_FAILED = "MetadataUpdateFailed"
    SYNCHRONIZED = "Synchronized"


HEALTHY_STATES = frozenset({ConnectionState.CONNECTED, ConnectionState.SYNCHRONIZED})


def parse_time(value: object) -> datetime | None:
    """RFC 3339 timestamp (as Kubernetes and Compass write them) or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # Normalised to UTC here, so formatting it later cannot fail: a year-1 time with a
        # positive offset (valid RFC 3339) would not fit into a datetime once shifted.
        return parsed.astimezone(UTC) if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None


def format_time(value: datetime) -> str:
    # Milliseconds kept: rounding an issue time down to the second would shorten grace periods.
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class KymaView:
    """What the agent needs from the Kyma CR `kyma-system/default`."""

    uid: str | None
    generation: int | None
    module_in_spec: bool
    runtime_id: str | None
    labels: Mapping[str, str]
    deleting: bool = False

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> KymaView:
        metadata = _mapping(raw.get("metadata"))
        labels = {str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()}
        modules = _mapping(raw.get("spec")).get("modules")
        names = (
            {str(_mapping(m).get("name")) for m in modules} if isinstance(modules, list) else set()
        )
        generation = metadata.get("generation")
        uid = metadata.get("uid")
        return cls(
            uid=uid if isinstance(uid, str) else None,
            generation=generation if isinstance(generation, int) else None,
            module_in_spec=MODULE_NAME in names,
            runtime_id=labels.get(RUNTIME_ID_LABEL) or None,
            labels=labels,
            deleting=bool(metadata.get("deletionTimestamp")),
        )


@dataclass(frozen=True)
class TokenRecord:
    """What the token secret says about the token it holds (from its annotations)."""

    managed: bool
    expires_at: datetime | None
    issued_at: datetime | None
    compass_runtime_id: str | None
    # Lower-case hex SHA-256 of the TOKEN the agent wrote (None in a secret someone else wrote):
    # lets the control plane match the token it issued without the token leaving the runtime.
    token_sha256: str | None = None
    # The CompassConnection's lastSync when the token was written ("" = none); None when the
    # secret carries no such record (written by someone else or an older agent).
    connection_seen: str | None = None

    @classmethod
    def from_secret(cls, raw: Mapping[str, Any]) -> TokenRecord:
        metadata = _mapping(raw.get("metadata"))
        labels = _mapping(metadata.get("labels"))
        annotations = _mapping(metadata.get("annotations"))
        runtime = annotations.get(COMPASS_RUNTIME_ID_ANNOTATION)
        managed = labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE
        return cls(
            managed=managed,
            expires_at=parse_time(annotations.get(EXPIRES_AT_ANNOTATION)),
            issued_at=parse_time(annotations.get(ISSUED_AT_ANNOTATION)),
            compass_runtime_id=runtime if isinstance(runtime, str) and runtime else None,
            token_sha256=_token_digest(_mapping(raw.get("data")).get("TOKEN")) if managed else None,
            connection_seen=_text(annotations.get(CONNECTION_SEEN_ANNOTATION)) if managed else None,
        )

    def expired(self, now: datetime) -> bool:
        # Unknown expiry (a secret someone else wrote) counts as expired: we cannot prove it
        # is still usable, and a connection that fails with it needs a fresh one.
        return self.expires_at is None or self.expires_at <= now


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _token_digest(encoded: object) -> str | None:
    """SHA-256 (hex) of a secret's base64 `TOKEN` value; None when absent or not base64."""
    if not isinstance(encoded, str) or not encoded:
        return None
    try:
        token = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return hashlib.sha256(token).hexdigest() if token else None


@dataclass(frozen=True)
class Connection:
    """compass-runtime-agent's CompassConnection `compass-connection` (cluster-scoped)."""

    state: str | None
    error: str | None
    certificate_not_after: datetime | None = None
    # `status.connectionStatus.lastSync` as written ("" when absent): compass-runtime-agent sets
    # it on every attempt, and compared as text it needs no clock.
    last_sync_text: str = ""
    handed_over: str | None = None  # HANDED_OVER_ANNOTATION

    @property
    def last_sync(self) -> datetime | None:
        return parse_time(self.last_sync_text)

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> Connection:
        status = _mapping(_mapping(raw).get("status"))
        annotations = _mapping(_mapping(_mapping(raw).get("metadata")).get("annotations"))
        state = status.get("connectionState")
        connection_status = _mapping(status.get("connectionStatus"))
        last_sync = connection_status.get("lastSync")
        error = connection_status.get("error")
        not_after = _mapping(connection_status.get("certificateStatus")).get("notAfter")
        return cls(
            state=state if isinstance(state, str) and state else None,
            error=error if isinstance(error, str) and error else None,
            certificate_not_after=parse_time(not_after),
            last_sync_text=last_sync if isinstance(last_sync, str) else "",
            handed_over=_text(annotations.get(HANDED_OVER_ANNOTATION)),
        )

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY_STATES

    @property
    def failed(self) -> bool:
        return self.state == ConnectionState.CONNECTION_FAILED


def fingerprint(
    *,
    module_enabled: bool,
    runtime_id: str | None,
    kyma: KymaView | None,
    application_connectors: Iterable[str],
    broker_url: str | None = None,
) -> str:
    """A digest of the watched inputs that could change the broker's answer.

    Status churn is left out on purpose: only spec generation, labels, the module signals and
    the runtime ID count, so a refused agent asks again when an admin changes something, not
    whenever a controller rewrites a status.
    """
    material = {
        "enabled": module_enabled,
        "runtime": runtime_id,
        "kyma": None
        if kyma is None
        else {"uid": kyma.uid, "generation": kyma.generation, "labels": dict(kyma.labels)},
        "acs": sorted(application_connectors),
    }
    if broker_url is not None:  # left out when unset, so earlier fingerprints stay the same
        material["broker"] = broker_url
    encoded = json.dumps(material, sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]
