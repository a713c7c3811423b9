"""A minimal async Kubernetes REST client (JSON in, JSON out) on one `httpx.AsyncClient`.

Errors are translated here, once:

    KubeError
    ├── KubeUnavailable   transport failure, 5xx, 429 (temporary)
    ├── NotFound          404
    ├── Conflict          409 (AlreadyExists or a stale resourceVersion)
    ├── Gone              410 (a watch's resourceVersion is too old: re-list)
    └── KubeRejected      other 4xx (RBAC, validation)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from control_plane_broker.kube.config import ClusterAccess

JSON = dict[str, Any]


class KubeError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeUnavailable(KubeError):
    pass


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class KubeRejected(KubeError):
    pass


def _raise_for(response: httpx.Response, what: str) -> None:
    status = response.status_code
    if status < 400:
        return
    try:
        message = str(response.json().get("message", ""))[:300]
    except (ValueError, AttributeError):
        message = ""
    text = f"{what}: HTTP {status} {message}".strip()
    if status == 404:
        raise NotFound(text, status=status)
    if status == 409:
        raise Conflict(text, status=status)
    if status == 410:
        raise Gone(text, status=status)
    if status == 429 or status >= 500:
        raise KubeUnavailable(text, status=status)
    raise KubeRejected(text, status=status)


class _Bearer(httpx.Auth):
    def __init__(self, access: ClusterAccess) -> None:
        self._access = access

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        token = self._access.bearer()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


class KubeClient:
    def __init__(
        self,
        access: ClusterAccess,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.server = access.server
        self._http = httpx.AsyncClient(
            base_url=access.server,
            verify=access.ssl_context() if access.server.startswith("https") else False,
            auth=_Bearer(access),
            timeout=httpx.Timeout(timeout),
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": "compass-broker"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: JSON | None = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> JSON:
        try:
            response = await self._http.request(
                method,
                path,
                params=params,
                content=None if body is None else json.dumps(body),
                headers={
                    **({"Content-Type": content_type} if body is not None else {}),
                    **({"Accept": accept} if accept else {}),
                },
            )
        except httpx.HTTPError as exc:
            raise KubeUnavailable(f"{method} {path}: {type(exc).__name__}") from exc
        _raise_for(response, f"{method} {path}")
        result: JSON = response.json()
        return result

    async def get(
        self, path: str, *, params: dict[str, str] | None = None, accept: str | None = None
    ) -> JSON:
        return await self._request("GET", path, params=params, accept=accept)

    async def get_or_none(self, path: str) -> JSON | None:
        try:
            return await self.get(path)
        except NotFound:
            return None

    async def create(self, path: str, body: JSON) -> JSON:
        return await self._request("POST", path, body=body)

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self._request("PUT", path, body=body)

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        return await self._request(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )

    async def delete(self, path: str) -> None:
        try:
            await self._request("DELETE", path)
        except NotFound:
            return

    async def watch(
        self, path: str, *, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[JSON]:
        """Yields watch events until the server ends the stream; raises Gone on 410."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        try:
            async with self._http.stream(
                "GET", path, params=params, timeout=httpx.Timeout(10.0, read=timeout_seconds + 30)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response, f"WATCH {path}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event: JSON = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object", {}).get("code")
                        if status == 410:
                            raise Gone(f"WATCH {path}: expired", status=410)
                        raise KubeUnavailable(f"WATCH {path}: error event {status}", status=status)
                    yield event
        except httpx.HTTPError as exc:
            raise KubeUnavailable(f"WATCH {path}: {type(exc).__name__}") from exc
