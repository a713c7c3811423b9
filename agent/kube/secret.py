"""The token secret `kyma-system/compass-agent-configuration`: built as data, written idempotently.

Always holds: the secret is Opaque with exactly the keys CONNECTOR_URL, TOKEN, RUNTIME_ID (the
Compass runtime ID) and TENANT; it carries the managed-by label and annotations with the token's
expiry, issue time and Compass runtime ID — never the token; a write happens only when the
desired content differs from what is stored; the agent deletes only a secret it labelled.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from agent.cluster_objects import (
    COMPASS_RUNTIME_ID_ANNOTATION,
    CONNECTION_SEEN_ANNOTATION,
    EXPIRES_AT_ANNOTATION,
    ISSUED_AT_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    format_time,
)
from agent.kube import resources
from agent.outcomes import Issued
from kubeapi import JSON, Conflict, KubeClient


class WriteResult(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def desired_secret(*, namespace: str, name: str, issued: Issued, connection_seen: str = "") -> JSON:
    data = {
        "CONNECTOR_URL": issued.connector_url,
        "TOKEN": issued.token,
        "RUNTIME_ID": issued.compass_runtime_id,
        "TENANT": issued.tenant,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
            "annotations": {
                EXPIRES_AT_ANNOTATION: format_time(issued.expires_at),
                ISSUED_AT_ANNOTATION: format_time(issued.issued_at),
                COMPASS_RUNTIME_ID_ANNOTATION: issued.compass_runtime_id,
                CONNECTION_SEEN_ANNOTATION: connection_seen,
            },
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def _sub(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def differs(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """True when writing `desired` would change `stored` (labels/annotations: ours only)."""
    want, have = _sub(desired.get("metadata")), _sub(stored.get("metadata"))
    for part in ("labels", "annotations"):
        theirs = _sub(have.get(part))
        if any(theirs.get(k) != v for k, v in _sub(want.get(part)).items()):
            return True
    return desired.get("data") != stored.get("data") or desired.get("type") != stored.get("type")


def merged(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> JSON:
    """`desired` on top of `stored`, keeping other writers' labels and annotations."""
    want, have = _sub(desired.get("metadata")), _sub(stored.get("metadata"))
    metadata = dict(have)
    for part in ("labels", "annotations"):
        metadata[part] = {**_sub(have.get(part)), **_sub(want.get(part))}
    return {**stored, "metadata": metadata, "data": desired["data"], "type": desired["type"]}


async def write_secret(client: KubeClient, desired: Mapping[str, Any]) -> WriteResult:
    metadata = _sub(desired.get("metadata"))
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    path = f"{resources.secrets(namespace)}/{name}"
    for _ in range(3):  # a conflict means someone wrote in between: re-read and compare again
        stored = await client.get_or_none(path)
        try:
            if stored is None:
                await client.create(resources.secrets(namespace), desired)
                return WriteResult.CREATED
            if stored.get("type") != desired.get("type"):
                # The type of a secret is immutable: replace the whole object.
                await client.delete(path, resource_version=stored["metadata"]["resourceVersion"])
                await client.create(resources.secrets(namespace), desired)
                return WriteResult.UPDATED
            if not differs(desired, stored):
                return WriteResult.UNCHANGED
            await client.replace(path, merged(desired, stored))
            return WriteResult.UPDATED
        except Conflict:
            continue
    raise Conflict(f"secret {namespace}/{name} kept changing while writing it", status=409)


async def read_secret(client: KubeClient, *, namespace: str, name: str) -> JSON | None:
    return await client.get_or_none(f"{resources.secrets(namespace)}/{name}")


async def delete_managed_secret(client: KubeClient, *, namespace: str, name: str) -> bool:
    """Deletes the secret if the agent wrote it; True when it is gone because of this call."""
    path = f"{resources.secrets(namespace)}/{name}"
    stored = await client.get_or_none(path)
    if stored is None:
        return False
    labels = _sub(_sub(stored.get("metadata")).get("labels"))
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE:
        return False
    try:
        return await client.delete(path, resource_version=stored["metadata"]["resourceVersion"])
    except Conflict:
        return False  # changed meanwhile; the next reconcile looks again
