"""Repository of `CompassManagerMapping` objects in the KCP namespace (reads go to the API server:
the claim protocol needs current resourceVersions, not a cache)."""

from __future__ import annotations

from typing import Any

from control_plane_broker.kyma import KYMA_GROUP, MAPPING_VERSION
from control_plane_broker.registration.state import Mapping
from kubeapi import KubeClient


class MappingRepository:
    def __init__(self, client: KubeClient, *, namespace: str) -> None:
        self._client = client
        self._base = (
            f"/apis/{KYMA_GROUP}/{MAPPING_VERSION}/namespaces/{namespace}/compassmanagermappings"
        )

    async def get(self, name: str) -> Mapping | None:
        obj = await self._client.get_or_none(f"{self._base}/{name}")
        return None if obj is None else Mapping.from_object(obj)

    async def list(self) -> list[Mapping]:
        listing = await self._client.get(self._base)
        return [Mapping.from_object(o) for o in listing.get("items") or []]

    async def create(self, obj: dict[str, Any]) -> Mapping:
        """Raises `Conflict` when it already exists."""
        return Mapping.from_object(await self._client.create(self._base, obj))

    async def replace(self, obj: dict[str, Any]) -> Mapping:
        """Raises `Conflict` when the resourceVersion in `obj` is stale."""
        name = obj["metadata"]["name"]
        return Mapping.from_object(await self._client.replace(f"{self._base}/{name}", obj))

    async def patch_status(
        self, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> None:
        """Merges `status`; with `resource_version`, raises `Conflict` when the mapping changed
        since it was read (a condition list is replaced whole, so a stale write would lose
        another replica's condition)."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        await self._client.merge_patch(f"{self._base}/{name}/status", body)

    async def delete(self, name: str) -> None:
        await self._client.delete(f"{self._base}/{name}")
