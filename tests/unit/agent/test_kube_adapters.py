"""The agent's secret adapter on httpx's MockTransport: idempotent writes, deleting only its own.
(Watching is `kubeapi.Informer`'s, tested in tests/unit/kubeapi and tests/integration/kubeapi.)"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime

import httpx

from agent.cluster_objects import TokenRecord
from agent.kube.secret import (
    WriteResult,
    delete_managed_secret,
    desired_secret,
    differs,
    write_secret,
)
from agent.outcomes import Issued
from kubeapi import ClusterAccess, KubeClient

ISSUED = Issued(
    token="ott-1",
    connector_url="https://c/graphql",
    compass_runtime_id="c-1",
    tenant="ga-1",
    expires_at=datetime(2025, 1, 1, 13, tzinfo=UTC),
    issued_at=datetime(2025, 1, 1, 12, tzinfo=UTC),
)


def client_for(handler: httpx.MockTransport) -> KubeClient:
    access = ClusterAccess(server="https://kube.test", token="t")
    return KubeClient(access, user_agent="test", transport=handler)


def test_desired_secret_shape() -> None:
    body = desired_secret(
        namespace="kyma-system", name="compass-agent-configuration", issued=ISSUED
    )
    assert body["type"] == "Opaque"
    decoded = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    assert decoded == {
        "CONNECTOR_URL": "https://c/graphql",
        "TOKEN": "ott-1",
        "RUNTIME_ID": "c-1",
        "TENANT": "ga-1",
    }
    annotations = body["metadata"]["annotations"]
    expires = annotations["compass-agent.kyma-project.io/token-expires-at"]
    assert expires == "2025-01-01T13:00:00.000Z"
    assert "ott-1" not in json.dumps(body["metadata"])


def test_the_secret_the_agent_writes_yields_the_hash_of_its_token() -> None:
    body = desired_secret(namespace="n", name="s", issued=ISSUED)
    record = TokenRecord.from_secret(body)
    assert record.token_sha256 == hashlib.sha256(b"ott-1").hexdigest()
    assert "ott-1" not in repr(record)


def test_differs_ignores_other_writers_metadata() -> None:
    desired = desired_secret(namespace="n", name="s", issued=ISSUED)
    stored = json.loads(json.dumps(desired))
    stored["metadata"]["labels"]["someone-else"] = "x"
    stored["metadata"]["resourceVersion"] = "5"
    assert not differs(desired, stored)
    stored["data"]["TOKEN"] = base64.b64encode(b"other").decode()
    assert differs(desired, stored)


async def test_write_secret_creates_then_leaves_unchanged_then_updates() -> None:
    store: dict[str, dict[str, object]] = {}
    writes: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        name = "/api/v1/namespaces/n/secrets/s"
        if request.method == "GET":
            return (
                httpx.Response(200, json=store[name])
                if name in store
                else httpx.Response(404, json={})
            )
        body = json.loads(request.content)
        body.setdefault("metadata", {})["resourceVersion"] = str(len(writes) + 1)
        store[name] = body
        writes.append(request.method)
        return httpx.Response(201 if request.method == "POST" else 200, json=body)

    client = client_for(httpx.MockTransport(handle))
    desired = desired_secret(namespace="n", name="s", issued=ISSUED)
    assert await write_secret(client, desired) is WriteResult.CREATED
    assert await write_secret(client, desired) is WriteResult.UNCHANGED
    newer = desired_secret(
        namespace="n", name="s", issued=Issued(**{**ISSUED.__dict__, "token": "ott-2"})
    )
    assert await write_secret(client, newer) is WriteResult.UPDATED
    await client.aclose()
    assert writes == ["POST", "PUT"]


async def test_delete_only_touches_a_secret_the_agent_wrote() -> None:
    deleted: list[str] = []
    foreign = {
        "metadata": {
            "name": "s",
            "resourceVersion": "1",
            "labels": {"app.kubernetes.io/managed-by": "other"},
        }
    }

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            deleted.append(request.url.path)
            return httpx.Response(200, json={})
        return httpx.Response(200, json=foreign)

    client = client_for(httpx.MockTransport(handle))
    assert not await delete_managed_secret(client, namespace="n", name="s")
    await client.aclose()
    assert deleted == []
