"""The registration record (a `CompassManagerMapping`) and the pure decisions taken on it.

What always holds:
- A mapping with the label `kyma-project.io/compass-runtime-id` is adopted as is (also when
  compass-manager wrote it) and nobody registers that Kyma again, until Director itself shows
  that runtime gone (`runtime(id:)` is null): then the ID is removed with the resourceVersion it
  was read at (`forgotten`), so of several replicas that notice, one removes it, and the next
  registration looks the runtime up before registering it again.
- Only the holder of an unexpired claim talks to Director about registering; a claim is taken by
  create or by update with the observed resourceVersion, so two replicas cannot both win.
- Before registering, Director is searched by our own label; a hit is recorded, never duplicated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from control_plane_broker.kyma import (
    KYMA_GROUP,
    LABEL_COMPASS_ID,
    LABEL_GLOBAL_ACCOUNT,
    LABEL_KYMA_NAME,
    LABEL_RUNTIME_ID,
    LABEL_SHOOT,
    LABEL_SUBACCOUNT,
    MAPPING_VERSION,
    KymaView,
)

FINALIZER = "kyma-project.io/cm-protection"
ANNOTATION_HOLDER = "compass-broker.kyma-project.io/claim-holder"
ANNOTATION_EXPIRES = "compass-broker.kyma-project.io/claim-expires"
# The Director labels sent with registerRuntime, written in the same update that records the
# Compass ID: the reconciler, woken by that very update, must not find them missing and write
# them again (status.directorLabels follows in a separate write and wins once it is there).
ANNOTATION_REGISTERED_LABELS = "compass-broker.kyma-project.io/registered-labels"
# BYOC enrolment (enrolment/enrolment_rules.py): the issuer an operator approved, and the one a
# caller presented first, with when. The broker writes only the pending pair, never an approval.
ANNOTATION_ISSUER_APPROVED = "compass-broker.kyma-project.io/issuer-approved"
ANNOTATION_ISSUER_PENDING = "compass-broker.kyma-project.io/issuer-pending"
ANNOTATION_ISSUER_PENDING_SINCE = "compass-broker.kyma-project.io/issuer-pending-since"
# Set by an operator: the explicit way to drop a runtime from Compass while its Kyma exists. The
# leader unregisters it and removes the mapping (deleting the mapping alone does not unregister).
# The value is the operator's reason. Without revocation or the module disabled, the runtime's next
# token request registers it anew.
ANNOTATION_UNREGISTER = "compass-broker.kyma-project.io/unregister"
# Set by an operator (`kubectl annotate`, RBAC decides who may): the runtime gets no token and its
# reports are refused; the value is the operator's reason, shown to the runtime. Never written by
# the broker.
ANNOTATION_REVOKED = "compass-broker.kyma-project.io/revoked"
KIND = "CompassManagerMapping"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST, _LAST = -62135596800, 253402300799  # 0001-01-01T00:00:00Z, 9999-12-31T23:59:59Z


def to_rfc3339(ts: float, *, microseconds: bool = False) -> str:
    """UTC, `Z`, whole seconds (or with the microseconds, when there are any and asked for);
    any time (a report's, from the agent) is clamped to years 1-9999, and the year always has
    four digits, as RFC 3339 and the API server want."""
    whole = math.floor(ts)
    seconds = min(max(whole, _FIRST), _LAST)
    fraction = int((ts - whole) * 1_000_000) if microseconds and seconds == whole else 0
    stamp = _EPOCH + timedelta(seconds=seconds, microseconds=min(fraction, 999_999))
    return stamp.isoformat().replace("+00:00", "Z")


def from_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class ConnectionRecord:
    """`status.connection`: the last connection report recorded (times as epoch seconds)."""

    state: str
    connected: bool
    certificate_not_after: str | None = None
    last_error: str | None = None
    token_sha256: str | None = None
    observed_at: float | None = None
    last_report_at: float | None = None
    # When a report said connected, as last written (the write is refreshed with lastReportAt):
    # tells "never connected since the last token" from "connected, then failed".
    last_connected_at: float | None = None

    @classmethod
    def parse(cls, raw: object) -> ConnectionRecord | None:
        """None for a status without a usable record (absent, or edited into another shape)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("state"), str):
            return None
        return cls(
            state=raw["state"],
            connected=raw.get("connected") is True,
            certificate_not_after=_text(raw.get("certificateNotAfter")),
            last_error=_text(raw.get("lastError")),
            token_sha256=_text(raw.get("tokenSha256")),
            observed_at=from_rfc3339(_text(raw.get("observedAt"))),
            last_report_at=from_rfc3339(_text(raw.get("lastReportAt"))),
            last_connected_at=from_rfc3339(_text(raw.get("lastConnectedAt"))),
        )

    def to_status(self) -> dict[str, Any]:
        """The status field; absent values as null, so a merge patch removes what was there."""
        return {
            "state": self.state,
            "connected": self.connected,
            "certificateNotAfter": self.certificate_not_after,
            "lastError": self.last_error,
            "tokenSha256": self.token_sha256,
            # Microseconds kept: two reports of one second, racing to two replicas, are
            # still told apart by when they were observed.
            "observedAt": (
                None
                if self.observed_at is None
                else to_rfc3339(self.observed_at, microseconds=True)
            ),
            "lastReportAt": _stamp(self.last_report_at),
            "lastConnectedAt": _stamp(self.last_connected_at),
        }


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _stamp(ts: float | None) -> str | None:
    return None if ts is None else to_rfc3339(ts)


@dataclass(frozen=True)
class TenantRefusal:
    """`status.compassRefusal`: Director did not know the global account or subaccount the
    Kyma named when it last tried to register (times as epoch seconds)."""

    global_account: str
    subaccount: str | None
    label: str  # the Kyma label that names what Director does not know
    value: str
    at: float

    @classmethod
    def parse(cls, raw: object) -> TenantRefusal | None:
        if not isinstance(raw, dict):
            return None
        at = from_rfc3339(_text(raw.get("at")))
        account, label, value = (_text(raw.get(k)) for k in ("globalAccount", "label", "value"))
        if at is None or account is None or label is None or value is None:
            return None
        return cls(account, _text(raw.get("subaccount")), label, value, at)

    def to_status(self) -> dict[str, Any]:
        return {
            "globalAccount": self.global_account,
            "subaccount": self.subaccount,
            "label": self.label,
            "value": self.value,
            "at": to_rfc3339(self.at),
        }


def refusal_stands(
    refusal: TenantRefusal | None, kyma: KymaView, *, now: float, recheck_seconds: float
) -> bool:
    """Is Director's refusal of this Kyma's tenants still the answer? Yes while the Kyma names
    the same global account and subaccount and the recheck period has not passed (a
    subaccount appears in Director once its tenant fetcher syncs it, with no change here)."""
    return (
        refusal is not None
        and refusal.global_account == kyma.tenant
        and refusal.subaccount == (kyma.labels.get(LABEL_SUBACCOUNT) or None)
        and 0 <= now - refusal.at < recheck_seconds
    )


@dataclass(frozen=True)
class Mapping:
    """A parsed `CompassManagerMapping`; `raw` keeps unknown fields so writes preserve them.

    The whole object is kept as compact JSON (`document`), not as a dict: the broker caches one
    mapping per runtime, and at N = 5,000 the dicts alone were about 9 KiB each against 2 KiB
    as bytes. Writes are rare next to reads of the parsed fields, so `raw` parses on demand.
    """

    name: str
    resource_version: str
    compass_id: str | None
    claim_holder: str | None
    claim_expires: float | None
    deleting: bool
    finalizers: tuple[str, ...]
    director_labels: dict[str, str]
    tenant: str | None
    runtime_id: str | None  # as written on the Kyma (case kept): Director's label holds it so
    shoot: str | None  # compass-manager's registrations are found by gardenerClusterName
    document: bytes = field(repr=False, compare=False)
    issuer_approved: str | None = None
    issuer_pending: str | None = None
    revoked: str | None = None  # the operator's reason ("" counts: the annotation revokes)
    connection: ConnectionRecord | None = None
    last_token_issued_at: float | None = None
    tenant_refusal: TenantRefusal | None = None
    unregister: str | None = None  # the operator's reason ("" counts: the annotation asks)

    @property
    def raw(self) -> dict[str, Any]:
        """The whole object as last seen, a fresh copy on every call (safe to change)."""
        value: dict[str, Any] = json.loads(self.document)
        return value

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Mapping:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            compass_id=labels.get(LABEL_COMPASS_ID) or None,
            claim_holder=annotations.get(ANNOTATION_HOLDER) or None,
            claim_expires=from_rfc3339(annotations.get(ANNOTATION_EXPIRES)),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(meta.get("finalizers") or ()),
            director_labels=_director_labels(status, annotations),
            tenant=labels.get(LABEL_GLOBAL_ACCOUNT) or None,
            runtime_id=labels.get(LABEL_RUNTIME_ID) or None,
            shoot=labels.get(LABEL_SHOOT) or None,
            document=json.dumps(obj, separators=(",", ":")).encode(),
            issuer_approved=str(annotations.get(ANNOTATION_ISSUER_APPROVED) or "") or None,
            issuer_pending=str(annotations.get(ANNOTATION_ISSUER_PENDING) or "") or None,
            revoked=(
                str(annotations[ANNOTATION_REVOKED]) if ANNOTATION_REVOKED in annotations else None
            ),
            connection=ConnectionRecord.parse(status.get("connection")),
            last_token_issued_at=from_rfc3339(_text(status.get("lastTokenIssuedAt"))),
            tenant_refusal=TenantRefusal.parse(status.get("compassRefusal")),
            unregister=(
                str(annotations[ANNOTATION_UNREGISTER])
                if ANNOTATION_UNREGISTER in annotations
                else None
            ),
        )


def _director_labels(status: dict[str, Any], annotations: dict[str, Any]) -> dict[str, str]:
    recorded = status.get("directorLabels")
    if not isinstance(recorded, dict):
        try:
            recorded = json.loads(str(annotations.get(ANNOTATION_REGISTERED_LABELS) or "{}"))
        except ValueError:
            recorded = {}
    if not isinstance(recorded, dict):
        return {}
    return {str(k): str(v) for k, v in recorded.items()}


# --- decisions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Adopt:
    compass_id: str


@dataclass(frozen=True)
class CreateClaimed:
    pass


@dataclass(frozen=True)
class TakeClaim:
    resource_version: str


@dataclass(frozen=True)
class Wait:
    retry_after: float


@dataclass(frozen=True)
class Proceed:
    """We hold the claim: look up in Director, then register or record."""

    claim_expires: float


@dataclass(frozen=True)
class Refuse:
    reason: str


Decision = Adopt | CreateClaimed | TakeClaim | Wait | Proceed | Refuse


def decide(mapping: Mapping | None, *, me: str, now: float) -> Decision:
    if mapping is None:
        return CreateClaimed()
    if mapping.deleting:
        # Being unregistered: no token may go out for a runtime that is on its way out.
        return Refuse("mapping is being deleted")
    if mapping.compass_id:
        return Adopt(mapping.compass_id)
    expires = mapping.claim_expires or 0.0
    if mapping.claim_holder and expires > now:
        if mapping.claim_holder == me:
            return Proceed(claim_expires=expires)
        return Wait(retry_after=expires - now)
    return TakeClaim(resource_version=mapping.resource_version)


@dataclass(frozen=True)
class Register:
    pass


@dataclass(frozen=True)
class Record:
    compass_id: str
    duplicates: tuple[str, ...] = ()


def after_lookup(ours: list[str], legacy: list[str]) -> Register | Record:
    """Found by our label → record it; else found by compass-manager's labels → adopt it; else
    register. Several hits (left by older tools) → the smallest ID, deterministically."""
    for found in (ours, legacy):
        if found:
            ordered = sorted(set(found))
            return Record(compass_id=ordered[0], duplicates=tuple(ordered[1:]))
    return Register()


# Clock skew allowed between the broker and the API server, plus the second that
# creationTimestamp truncates away.
SKEW_SECONDS = 2.0


def certainly_new(*, created_at: float | None, watched_since: float | None, vanished: bool) -> bool:
    """Can nobody have registered this Kyma? Yes when no mapping of it can have existed
    without us seeing it: every registrar (this broker, compass-manager) creates the mapping
    before it registers; the Kyma was created after our mapping watch last listed (so any
    mapping of it since passed through the watch), and no mapping of that name was seen to go
    (deleted, or force-deleted by an operator). Otherwise the runtime is looked up in Director
    before it is registered."""
    return (
        created_at is not None
        and watched_since is not None
        and created_at > watched_since + SKEW_SECONDS
        and not vanished
    )


def safe_to_register(*, claim_expires: float, now: float, call_budget: float) -> bool:
    """Register only if the claim outlives the call: an expired claim lets another replica in."""
    return claim_expires - now > call_budget


# --- desired objects -------------------------------------------------------------------------


def new_mapping(
    kyma: KymaView, *, namespace: str, me: str, now: float, claim_seconds: float
) -> dict[str, Any]:
    return _mapping_object(
        kyma,
        namespace=namespace,
        annotations={
            ANNOTATION_HOLDER: me,
            ANNOTATION_EXPIRES: to_rfc3339(now + claim_seconds),
        },
    )


def adopted_mapping(kyma: KymaView, *, namespace: str, compass_id: str) -> dict[str, Any]:
    """A mapping recording a Compass runtime Director still holds: what a mapping deleted while
    its Kyma exists is replaced with."""
    obj = _mapping_object(kyma, namespace=namespace, annotations={})
    obj["metadata"]["labels"][LABEL_COMPASS_ID] = compass_id
    return obj


def new_pending_mapping(
    kyma: KymaView, *, namespace: str, issuer: str, now: float
) -> dict[str, Any]:
    """The mapping of a runtime first seen through enrolment: no claim, no Compass ID yet; the
    registration claims it later like any mapping without a live claim."""
    return _mapping_object(kyma, namespace=namespace, annotations=_pending(issuer, now))


def with_pending_issuer(mapping: Mapping, *, issuer: str, now: float) -> dict[str, Any]:
    """The mapping with `issuer` recorded as pending; everything else (an approval, a claim)
    kept as it is."""
    obj = mapping.raw
    meta = obj.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **_pending(issuer, now)}
    return obj


def _pending(issuer: str, now: float) -> dict[str, str]:
    return {ANNOTATION_ISSUER_PENDING: issuer, ANNOTATION_ISSUER_PENDING_SINCE: to_rfc3339(now)}


def _mapping_object(
    kyma: KymaView, *, namespace: str, annotations: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": f"{KYMA_GROUP}/{MAPPING_VERSION}",
        "kind": KIND,
        "metadata": {
            "name": kyma.name,
            "namespace": namespace,
            "labels": _labels(kyma),
            "annotations": annotations,
            "finalizers": [FINALIZER],
        },
    }


def _labels(kyma: KymaView) -> dict[str, str]:
    labels = {LABEL_KYMA_NAME: kyma.name}
    # Runtime ID and shoot name as the Kyma had them: after a crash between registering and
    # recording, the sweep finds the Director runtime by them even once the Kyma is gone.
    for key in (LABEL_GLOBAL_ACCOUNT, LABEL_SUBACCOUNT, LABEL_RUNTIME_ID, LABEL_SHOOT):
        if kyma.labels.get(key):
            labels[key] = kyma.labels[key]
    return labels


def claimed(mapping: Mapping, *, me: str, now: float, claim_seconds: float) -> dict[str, Any]:
    obj = mapping.raw
    meta = obj.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {}) or {}
    annotations[ANNOTATION_HOLDER] = me
    annotations[ANNOTATION_EXPIRES] = to_rfc3339(now + claim_seconds)
    meta["annotations"] = annotations
    finalizers = list(meta.get("finalizers") or [])
    if FINALIZER not in finalizers:
        finalizers.append(FINALIZER)
    meta["finalizers"] = finalizers
    return obj


def recorded(
    mapping: Mapping, *, compass_id: str, director_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The mapping with the Compass runtime ID recorded and the claim released (and the
    Director labels sent, when this broker registered it)."""
    obj = mapping.raw
    meta = obj.setdefault("metadata", {})
    labels = dict(meta.get("labels") or {})
    labels[LABEL_COMPASS_ID] = compass_id
    meta["labels"] = labels
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(ANNOTATION_HOLDER, None)
    annotations.pop(ANNOTATION_EXPIRES, None)
    if director_labels is not None:
        annotations[ANNOTATION_REGISTERED_LABELS] = json.dumps(director_labels, sort_keys=True)
    meta["annotations"] = annotations
    return obj


def forgotten(mapping: Mapping) -> dict[str, Any]:
    """The mapping without its Compass runtime ID and the labels registered with it: Director
    showed that runtime gone. The runtime is registered again (after a look-up) on demand."""
    obj = mapping.raw
    meta = obj.setdefault("metadata", {})
    meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k != LABEL_COMPASS_ID}
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(ANNOTATION_REGISTERED_LABELS, None)
    meta["annotations"] = annotations
    return obj


def unregistered_but_revoked(mapping: Mapping) -> dict[str, Any]:
    """A revoked mapping whose runtime was just unregistered while its Kyma lives: kept, without
    the runtime, the operator's unregister request or a claim, so that the revocation outlives
    the registration (deleted, the next token request would create a mapping that is not)."""
    obj = forgotten(mapping)
    meta = obj["metadata"]
    annotations = dict(meta.get("annotations") or {})
    for key in (ANNOTATION_UNREGISTER, ANNOTATION_HOLDER, ANNOTATION_EXPIRES):
        annotations.pop(key, None)
    meta["annotations"] = annotations
    return obj


def without_finalizer(mapping: Mapping) -> dict[str, Any]:
    obj = mapping.raw
    meta = obj.setdefault("metadata", {})
    meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
    return obj


# --- status ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """A condition as the broker sets it on a mapping (`with_condition`)."""

    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class ConditionSet:
    """The conditions with one condition set, and what that did to that condition: `changed`,
    anything to write; `news`, worth an Event (a new status or a new reason, so a failure that
    keeps failing the same way writes nothing and tells nobody twice; a new message alone is
    written, not told)."""

    conditions: list[dict[str, Any]]
    changed: bool
    news: bool


def with_condition(
    conditions: list[dict[str, Any]], condition: Condition, *, now: float, generation: int | None
) -> ConditionSet:
    """`conditions` with `condition` upserted, its `observedGeneration` the mapping's
    `generation`; `lastTransitionTime` changes only when the status flips. Other conditions
    are kept as they are, so an unchanged input gives an equal output (nothing to write)."""
    after = _set_condition(
        conditions,
        type_=condition.type,
        status=condition.status,
        reason=condition.reason,
        message=condition.message,
        now=now,
        observed_generation=generation,
    )
    old = find_condition(conditions, condition.type) or {}
    new = find_condition(after, condition.type) or {}
    changed = old != new
    said = (old.get("status"), old.get("reason")) != (new.get("status"), new.get("reason"))
    return ConditionSet(after, changed=changed, news=changed and said)


def _set_condition(
    conditions: list[dict[str, Any]],
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    value = "True" if status else "False"
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") == type_:
            found = True
            flipped = cond.get("status") != value
            out.append(
                _condition(
                    type_,
                    value,
                    reason=reason,
                    message=message,
                    since=to_rfc3339(now)
                    if flipped
                    else cond.get("lastTransitionTime", to_rfc3339(now)),
                    generation=observed_generation,
                )
            )
        else:
            out.append(cond)
    if not found:
        out.append(
            _condition(
                type_,
                value,
                reason=reason,
                message=message,
                since=to_rfc3339(now),
                generation=observed_generation,
            )
        )
    return out


def _condition(
    type_: str, value: str, *, reason: str, message: str, since: str, generation: int | None
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def find_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def conditions_of(mapping: Mapping | None) -> list[dict[str, Any]]:
    if mapping is None:
        return []
    raw = (mapping.raw.get("status") or {}).get("conditions") or []
    return [dict(c) for c in raw if isinstance(c, dict)]


def generation_of(mapping: Mapping | None) -> int | None:
    if mapping is None:
        return None
    value = (mapping.raw.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) else None


def failure_reason(slug: str) -> str:
    """A condition reason (CamelCase, as Kubernetes wants) from a problem slug:
    `compass-unavailable` → `CompassUnavailable`."""
    return "".join(part.capitalize() for part in slug.split("-") if part) or "Failed"
