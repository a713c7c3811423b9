"""A small async Kubernetes REST client on httpx: JSON in, JSON out, one error tree.

Error tree (translated once, in `_translate`):

    KubeError                 anything that went wrong talking to the API server
    ├── KubeUnavailable       transport failure or 5xx/429: try again later
    ├── NotFound (404)
    ├── Conflict (409)        create of an existing object, stale resourceVersion on update
    └── Gone (410)            a watch's resourceVersion is too old: re-list

Always holds: objects are plain dicts as the API server sends them; the bearer token of an
in-cluster config is re-read for every request (the kubelet rotates it); credentials never
reach a log line or an exception message.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

JSON = dict[str, Any]

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class KubeUnavailable(KubeError):
    pass


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: KubeUnavailable,
}


def _error_for(status: int, body: bytes) -> KubeError:
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = str(json.loads(body).get("message", ""))
    cls = _BY_STATUS.get(status, KubeUnavailable if status >= 500 else KubeError)
    return cls(status, message or f"HTTP {status}")


@contextlib.contextmanager
def _translate() -> Any:
    try:
        yield
    except httpx.RequestError as e:  # transport errors, and a body that cannot be decoded
        raise KubeUnavailable(None, f"API server unreachable: {type(e).__name__}") from e


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate: built from a kubeconfig or in-cluster."""

    server: str
    ssl_context: ssl.SSLContext
    token: Callable[[], str | None]

    @classmethod
    def from_kubeconfig(cls, path: Path, *, context: str | None = None) -> KubeConfig:
        doc = yaml.safe_load(path.read_text())
        ctx_name = context or doc.get("current-context")
        ctx = _named(doc.get("contexts"), ctx_name)["context"]
        cluster = _named(doc.get("clusters"), ctx["cluster"])["cluster"]
        user = _named(doc.get("users"), ctx["user"])["user"] or {}
        base = path.parent
        ssl_context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            ssl_context.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
        elif cluster.get("certificate-authority"):
            ssl_context.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
        cert = _material(user, "client-certificate", base)
        key = _material(user, "client-key", base)
        if cert and key:
            _load_cert_chain(ssl_context, cert, key)
        token = user.get("token")
        token_file = user.get("tokenFile")
        if token_file:
            token_path = base / token_file
            return cls(cluster["server"], ssl_context, lambda: token_path.read_text().strip())
        return cls(cluster["server"], ssl_context, lambda: token)

    @classmethod
    def in_cluster(cls, folder: Path = IN_CLUSTER_DIR) -> KubeConfig:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        ssl_context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        token_path = folder / "token"
        return cls(f"https://{host}:{port}", ssl_context, lambda: token_path.read_text().strip())


def _named(items: object, name: str) -> Mapping[str, Any]:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    raise ValueError(f"kubeconfig has no entry named {name!r}")


def _material(user: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data, file = user.get(f"{key}-data"), user.get(key)
    if isinstance(data, str) and data:
        return base64.b64decode(data)
    if isinstance(file, str) and file:
        return (base / file).read_bytes()
    return None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl only loads client certificates from files; the files live only as long as this call.
    with tempfile.TemporaryDirectory() as folder:
        cert_path, key_path = Path(folder, "tls.crt"), Path(folder, "tls.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(str(cert_path), str(key_path))


class _BearerAuth(httpx.Auth):
    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Any:
        token = self._token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


class KubeClient:
    """JSON verbs against one API server. Paths are absolute API paths (`/api/v1/...`)."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float = 15.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=config.server,
            verify=config.ssl_context,
            auth=_BearerAuth(config.token),
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": "compass-agent"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        with _translate():
            response = await self._http.request(
                method,
                path,
                params=params,
                content=None if body is None else json.dumps(body).encode(),
                headers={"Content-Type": content_type} if body is not None else None,
            )
        if response.status_code >= 400:
            raise _error_for(response.status_code, response.content)
        if not response.content:
            return {}
        result: JSON = response.json()
        return result

    async def get(self, path: str) -> JSON | None:
        """The object, or None when it does not exist."""
        try:
            return await self._request("GET", path)
        except NotFound:
            return None

    async def list(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> JSON:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        return await self._request("GET", path, params=params or None)

    async def create(self, path: str, body: Mapping[str, Any]) -> JSON:
        return await self._request("POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> JSON:
        return await self._request("PUT", path, body=body)

    async def delete(self, path: str, *, resource_version: str | None = None) -> bool:
        """True when this call deleted it, False when it was already gone."""
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self._request("DELETE", path, body=body)
        except NotFound:
            return False
        return True

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[JSON]:
        """Watch events (`{"type", "object"}`) after `resource_version` until the server ends.

        Raises Gone when the version is too old (the caller re-lists).
        """
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if field_selector:
            params["fieldSelector"] = field_selector
        # Read timeout a little longer than the server's own, so a dead connection is noticed.
        timeout = httpx.Timeout(self._timeout, read=timeout_seconds + self._timeout)
        with _translate():
            async with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    raise _error_for(response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event: JSON = json.loads(line)
                    except ValueError as e:
                        # A stream cut mid-line ends in a fragment: treat it as a dropped watch.
                        raise KubeUnavailable(None, "garbled watch event") from e
                    if event.get("type") == "ERROR":
                        status = event.get("object", {})
                        raise _error_for(int(status.get("code", 500)), json.dumps(status).encode())
                    yield event
