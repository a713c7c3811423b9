"""A small async Kubernetes REST client: JSON in, JSON out, on ONE `httpx.AsyncClient`.

Paths are absolute API paths (`/api/v1/namespaces/x/secrets/y`). Verbs: `get` (raises
NotFound), `get_or_none`, `list` (follows `limit`/`continue` pages itself), `create`,
`replace`, `merge_patch`, `json_patch`, `delete`, `watch` (an async iterator of events).

Always holds: every failure leaves as a `KubeError` subclass (see `kubeapi.kube_errors`), made in
one place (`_translated` for what httpx raises, `_decode` for what the server answered): a transport
error, a body that is not a JSON object, a list without an `items` list, a watch line that is not a
JSON event, an ERROR event — never a ValueError, KeyError or TypeError; answers and watch lines are
bounded in size (`max_body_bytes`); `on_request(verb, status)` is called once for every request sent
(status None when none came back), so callers can count API-server requests; at most
`max_connections` requests are in flight (the rest wait in a semaphore, not in httpcore's pool), and
watches hold connections of their own; environment proxies and `.netrc` are ignored (where we
connect is the kubeconfig's business); the bearer token is asked of `ClusterAccess.bearer()` per
request, so rotated files are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from kubeapi.config import ClusterAccess
from kubeapi.kube_errors import Gone, KubeUnavailable, NotFound, error_for_status
from kubeapi.transport import describe_transport_error

JSON = dict[str, Any]
OnRequest = Callable[[str, int | None], None]
PatchOperations = list[JSON]  # named here: inside KubeClient, `list` is the verb

DEFAULT_MAX_BODY_BYTES = 64 << 20  # a page of 500 large objects fits many times over
WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


@dataclass(frozen=True)
class Listing:
    """All items of a collection (every page), and the version to watch from."""

    items: list[JSON]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised)
    object: JSON

    @property
    def resource_version(self) -> str | None:
        version = _mapping(self.object.get("metadata")).get("resourceVersion")
        return version if isinstance(version, str) and version else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _status_message(raw: bytes) -> str:
    """The `message` of a Status body, on one line and bounded; empty when there is none."""
    with contextlib.suppress(ValueError, RecursionError):
        message = _mapping(json.loads(raw)).get("message")
        if isinstance(message, str):
            return " ".join(message.split())[:300]
    return ""


def _decode(status: int, raw: bytes, what: str) -> JSON:
    """The JSON object of a 2xx answer, or the error that the answer means."""
    if not 200 <= status < 300:
        message = _status_message(raw)
        raise error_for_status(
            status, f"{what}: HTTP {status}" + (f" {message}" if message else "")
        )
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise KubeUnavailable(f"{what}: the answer is not JSON", status=status) from None
    if not isinstance(value, dict):
        raise KubeUnavailable(f"{what}: the answer is not a JSON object", status=status)
    return value


def _watch_event(line: bytes, what: str) -> WatchEvent:
    """One line of a watch stream as an event; an ERROR event is raised as its error."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        # Also what a stream cut mid-line ends with: a dropped watch, not a crash.
        raise KubeUnavailable(f"{what}: garbled watch event") from None
    kind = _mapping(event).get("type")
    obj = _mapping(event).get("object")
    if not isinstance(obj, dict):
        raise KubeUnavailable(f"{what}: watch event without an object")
    if kind == "ERROR":
        code = obj.get("code")
        message = obj.get("message")
        text = f"{what}: watch ERROR {code}" + (
            f" {' '.join(message.split())[:300]}" if isinstance(message, str) else ""
        )
        if isinstance(code, int) and not isinstance(code, bool):
            raise error_for_status(code, text)
        raise KubeUnavailable(text)
    if kind not in WATCH_EVENT_TYPES:
        raise KubeUnavailable(f"{what}: unknown watch event type")
    return WatchEvent(type=str(kind), object=obj)


def _items(page: JSON, what: str) -> list[JSON]:
    items = page.get("items", ...)
    if items is None:  # Go's empty slice can be serialised as null
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise KubeUnavailable(f"{what}: the list has no items list of objects")
    return items


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """httpx's exceptions as ours, once for every verb."""
    try:
        yield
    except httpx.HTTPError as exc:  # transport errors, protocol errors, undecodable bodies
        raise KubeUnavailable(f"{what}: {describe_transport_error(exc)}") from exc
    except httpx.InvalidURL as exc:
        raise KubeUnavailable(f"{what}: invalid URL") from exc


class _Bearer(httpx.Auth):
    def __init__(self, access: ClusterAccess) -> None:
        self._access = access

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._access.bearer()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


WATCH_CONNECTIONS = 8  # room for the watches one client runs besides its requests


class KubeClient:
    def __init__(
        self,
        access: ClusterAccess,
        *,
        user_agent: str,
        timeout: float = 10.0,
        max_connections: int = 10,
        transport: httpx.AsyncBaseTransport | None = None,
        on_request: OnRequest | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.server = access.server
        self._timeout = timeout
        self._on_request = on_request
        self._max_body = max_body_bytes
        # Requests wait here, not in httpcore's pool: its bookkeeping grows with the requests
        # queued times the connections, which under a burst of thousands is most of the CPU.
        self._slots = asyncio.Semaphore(max_connections)
        self._http = httpx.AsyncClient(
            base_url=access.server,
            verify=access.ssl_context(),
            auth=_Bearer(access),
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(
                # Watches hold a connection each and do not take a request slot.
                max_connections=max_connections + WATCH_CONNECTIONS,
                # All of them kept alive: closing one a watch pushed over the limit would
                # cost a TLS handshake for the next request.
                max_keepalive_connections=max_connections + WATCH_CONNECTIONS,
            ),
            transport=transport,
            trust_env=False,
            follow_redirects=False,
            headers={"Accept": "application/json", "User-Agent": user_agent},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # -- one request -------------------------------------------------------------------------

    def _report(self, verb: str, status: int | None) -> None:
        if self._on_request is not None:
            self._on_request(verb, status)

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > self._max_body:
                raise KubeUnavailable(f"{what}: the answer is too large")
        return bytes(body)

    async def _call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> JSON:
        what = f"{method} {path}"
        headers = {"Content-Type": content_type} if body is not None else {}
        if accept:
            headers["Accept"] = accept
        status: int | None = None
        try:
            with _translated(what):
                async with (
                    self._slots,
                    self._http.stream(
                        method,
                        path,
                        params=params,
                        content=None if body is None else json.dumps(body).encode(),
                        headers=headers or None,
                    ) as response,
                ):
                    status = response.status_code
                    raw = await self._read(response, what)
        finally:
            self._report(verb, status)
        assert status is not None  # set whenever no exception left the block
        return _decode(status, raw, what)

    # -- verbs -------------------------------------------------------------------------------

    async def get(
        self, path: str, *, params: Mapping[str, str] | None = None, accept: str | None = None
    ) -> JSON:
        """The object; raises NotFound when there is none. `accept` for endpoints that serve
        another media type than plain JSON (the issuer's key set)."""
        return await self._call("get", "GET", path, params=params, accept=accept)

    async def get_or_none(
        self, path: str, *, params: Mapping[str, str] | None = None
    ) -> JSON | None:
        try:
            return await self.get(path, params=params)
        except NotFound:
            return None

    async def list(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Listing:
        """Every item of the collection, page by page (`limit` / `continue`)."""
        base = {}
        if label_selector:
            base["labelSelector"] = label_selector
        if field_selector:
            base["fieldSelector"] = field_selector
        items: list[JSON] = []
        token: str | None = None
        while True:
            params = {**base, "limit": str(page_size)}
            if token:
                params["continue"] = token
            try:
                page = await self._call("list", "GET", path, params=params)
            except Gone:
                if token is None:
                    raise
                # The continue token expired between pages: one unpaged list instead, as
                # client-go's pager does (a fresh paged list could expire again).
                page = await self._call("list", "GET", path, params=base)
                return Listing(items=_items(page, path), resource_version=_version(page))
            items += _items(page, path)
            token = _mapping(page.get("metadata")).get("continue")
            if not isinstance(token, str) or not token:
                return Listing(items=items, resource_version=_version(page))

    async def create(self, path: str, body: Mapping[str, Any]) -> JSON:
        return await self._call("create", "POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> JSON:
        """PUT; with `metadata.resourceVersion` in `body` a stale version raises Conflict."""
        return await self._call("update", "PUT", path, body=body)

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> JSON:
        return await self._call(
            "patch", "PATCH", path, body=body, content_type="application/merge-patch+json"
        )

    async def json_patch(self, path: str, operations: PatchOperations) -> JSON:
        """RFC 6902 operations; a failed `test` operation answers 422 (KubeRejected)."""
        return await self._call(
            "patch", "PATCH", path, body=operations, content_type="application/json-patch+json"
        )

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> JSON:
        """Server-side apply of `body` (the whole intent of `field_manager`) at the object's
        path. JSON is YAML, so the body goes as is; `force` takes fields over from other
        managers instead of answering 409 (what an owner like lifecycle-manager does)."""
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        return await self._call(
            "apply",
            "PATCH",
            path,
            params=params,
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def delete(self, path: str, *, resource_version: str | None = None) -> bool:
        """True when this call deleted it, False when it was already gone. With
        `resource_version` the deletion is conditional (Conflict when the object changed)."""
        options: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            options["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self._call("delete", "DELETE", path, body=options)
        except NotFound:
            return False
        return True

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` (with bookmarks) until the server ends the stream.

        Raises Gone when the version is too old (re-list), KubeUnavailable when the stream
        breaks or carries something that is not a watch event."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        what = f"WATCH {path}"
        # Read timeout a little longer than the server's own, so a dead connection is noticed.
        timeout = httpx.Timeout(self._timeout, read=timeout_seconds + self._timeout)
        reported = False
        try:
            with _translated(what):
                async with self._http.stream("GET", path, params=params, timeout=timeout) as rsp:
                    reported = True
                    self._report("watch", rsp.status_code)
                    if rsp.status_code != 200:
                        _decode(rsp.status_code, await self._read(rsp, what), what)
                        raise KubeUnavailable(f"{what}: HTTP {rsp.status_code} without a stream")
                    async for line in self._lines(rsp, what):
                        yield _watch_event(line, what)
        finally:
            if not reported:
                self._report("watch", None)

    async def _lines(self, response: httpx.Response, what: str) -> AsyncIterator[bytes]:
        buffer = bytearray()
        async for chunk in response.aiter_bytes():
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    yield line
            if len(buffer) > self._max_body:
                raise KubeUnavailable(f"{what}: a watch event is too large")
        if buffer.strip():
            yield bytes(buffer)  # a fragment: fails to parse, and so ends the watch as dropped


def _version(page: JSON) -> str:
    version = _mapping(page.get("metadata")).get("resourceVersion")
    return version if isinstance(version, str) else ""
