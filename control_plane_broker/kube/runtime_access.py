"""Access to a runtime's own API server, from its kubeconfig Secret in KCP.

The Secret is read by its exact name (`BROKER_RUNTIME_KUBECONFIG_SECRET_PATTERN`, default
`kubeconfig-{runtime_id}`, data key `config`): a label would let any Secret that carries it
stand in for the runtime's. The kubeconfig is someone else's input and is parsed with
`kubeapi.access_from_untrusted_kubeconfig`: https servers with inline credentials only, never a
local file, a command or a skipped TLS check. A Secret that breaks those rules costs nothing
but its read: no request leaves the broker, the caller gets `runtime-kubeconfig-invalid` and
`on_invalid` is told (the broker puts an Event on the Kyma).

Clients are per cluster, not per runtime: runtimes whose kubeconfigs name the same server with
the same credentials share one connection pool. A client that is retired (the cache is over its
size) is closed only after any request that may still use it has timed out. Loads of one
runtime are shared by concurrent callers. The kubeconfig text is never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    IdentityNotProven,
    RuntimeKubeconfigInvalid,
)
from control_plane_broker.singleflight import SingleFlight
from kubeapi import (
    ClusterAccess,
    KubeClient,
    KubeconfigError,
    KubeError,
    access_from_untrusted_kubeconfig,
)

log = logging.getLogger(__name__)

KUBECONFIG_DATA_KEY = "config"
NEGATIVE_SECONDS = 10.0  # a missing or broken Secret is read again after this long
RUNTIME_MAX_BODY_BYTES = 1 << 20

OnInvalid = Callable[[str, str], Awaitable[None]]  # (runtime ID, what is wrong)


@dataclass(frozen=True)
class _Entry:
    """What a Secret read found, as plain data: a client, or why there is none. Never the
    exception itself (it holds a traceback and the frames it went through: ~500 bytes a
    runtime ID, kept for every ID ever asked about)."""

    expires: float
    client: KubeClient | None = None
    missing: bool = False  # no kubeconfig Secret (or no `config` in it)
    invalid: str | None = None  # why the Secret is unusable


def _problem(entry: _Entry) -> IdentityNotProven | RuntimeKubeconfigInvalid:
    if entry.missing:
        return IdentityNotProven("no kubeconfig for this runtime in KCP", reason="no-kubeconfig")
    return RuntimeKubeconfigInvalid(
        f"the runtime kubeconfig Secret is unusable ({entry.invalid})", retry_after=60
    )


def cluster_key(access: ClusterAccess) -> str:
    """Same server and same credentials → same client (the hash never leaves the process)."""
    digest = hashlib.sha256()
    for part in (
        access.server.encode(),
        access.ca_pem or b"",
        access.client_cert_pem or b"",
        access.client_key_pem or b"",
        (access.token or "").encode(),
    ):
        digest.update(len(part).to_bytes(4, "big") + part)
    return digest.hexdigest()


class RuntimeAccess:
    def __init__(
        self,
        kcp: KubeClient,
        *,
        namespace: str,
        secret_name_pattern: str,
        ttl_seconds: float,
        clock: Callable[[], float],
        timeout: float = 10.0,
        max_clusters: int = 4096,
        max_runtimes: int = 20_000,
        unreachable_seconds: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        on_invalid: OnInvalid | None = None,
    ) -> None:
        self._kcp = kcp
        self._namespace = namespace
        self._pattern = secret_name_pattern
        self._ttl = ttl_seconds
        self._clock = clock
        self._timeout = timeout
        self._max_clusters = max_clusters
        self._transport = transport  # tests plug in here
        self._on_invalid = on_invalid
        # Per runtime ID, least recently used first: at most `max_runtimes`, whatever callers
        # ask about (a flood of IDs costs reads, not memory).
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max_runtimes = max_runtimes
        self._clusters: OrderedDict[str, KubeClient] = OrderedDict()
        # API server URL → until when it counts as not answering (at most `max_clusters`).
        self._unreachable: OrderedDict[str, float] = OrderedDict()
        self._unreachable_seconds = unreachable_seconds
        self._loads: SingleFlight[KubeClient] = SingleFlight()
        self._retiring: set[asyncio.Task[None]] = set()

    def secret_name(self, runtime_id: str) -> str:
        return self._pattern.format(runtime_id=runtime_id.lower())

    async def client_for(self, runtime_id: str) -> KubeClient:
        key = runtime_id.lower()
        entry = self._entries.get(key)
        if entry is not None and entry.expires > self._clock():
            if entry.client is None:
                raise _problem(entry)
            return entry.client
        return await self._loads.do(key, lambda: self._load(key, runtime_id))

    def _remember(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_runtimes:
            self._entries.popitem(last=False)

    # -- servers that did not answer ----------------------------------------------------------

    def unreachable_for(self, client: KubeClient) -> float | None:
        """Seconds this client's API server still counts as not answering, or None. Asked
        before a request: an API server that let a request time out is not asked again for a
        while, so a stalled server costs one timeout per `unreachable_seconds`, not one per
        caller (48 callers on a stalled runtime held every first-contact place for 10 s each)."""
        until = self._unreachable.get(client.server)
        if until is None:
            return None
        left = until - self._clock()
        if left <= 0:
            del self._unreachable[client.server]
            return None
        return left

    def note_unreachable(self, client: KubeClient) -> None:
        self._unreachable[client.server] = self._clock() + self._unreachable_seconds
        self._unreachable.move_to_end(client.server)
        while len(self._unreachable) > self._max_clusters:
            self._unreachable.popitem(last=False)

    async def _load(self, key: str, runtime_id: str) -> KubeClient:
        now = self._clock()
        try:
            secret = await self._kcp.get_or_none(
                f"/api/v1/namespaces/{self._namespace}/secrets/{self.secret_name(runtime_id)}"
            )
        except KubeError as exc:
            raise ControlPlaneUnavailable(
                "cannot read the runtime kubeconfig", retry_after=5
            ) from exc
        try:
            access = self._access_from(secret)
        except IdentityNotProven:
            self._remember(key, entry := _Entry(expires=now + NEGATIVE_SECONDS, missing=True))
            raise _problem(entry) from None
        except KubeconfigError as exc:
            entry = _Entry(expires=now + NEGATIVE_SECONDS, invalid=exc.reason)
            self._remember(key, entry)
            problem = _problem(entry)
            log.warning(
                "runtime kubeconfig refused",
                extra={"runtime_id": runtime_id, "reason": exc.reason},
            )
            if self._on_invalid is not None:
                await self._on_invalid(runtime_id, f"{exc.reason}: {exc}")
            raise problem from None
        client = self._cluster_client(access)
        self._remember(key, _Entry(expires=now + self._ttl, client=client))
        return client

    def _access_from(self, secret: dict[str, object] | None) -> ClusterAccess:
        data = secret.get("data") if isinstance(secret, dict) else None
        encoded = data.get(KUBECONFIG_DATA_KEY) if isinstance(data, dict) else None
        if not encoded:
            # Without the runtime's kubeconfig nothing can prove this runtime's identity.
            raise IdentityNotProven("no kubeconfig for this runtime in KCP", reason="no-kubeconfig")
        try:
            text = base64.b64decode(str(encoded), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise KubeconfigError(
                "the Secret's config is not base64 text", reason="bad-base64"
            ) from None
        return access_from_untrusted_kubeconfig(text)

    def _cluster_client(self, access: ClusterAccess) -> KubeClient:
        key = cluster_key(access)
        client = self._clusters.get(key)
        if client is not None:
            self._clusters.move_to_end(key)
            return client
        client = KubeClient(
            access,
            user_agent="compass-broker",
            timeout=self._timeout,
            max_connections=16,
            transport=self._transport,
            # A TokenReview, a discovery document or a key set: a few KiB. A runtime's API
            # server is the runtime owner's (BYOC: wholly), so its answers are capped too.
            max_body_bytes=RUNTIME_MAX_BODY_BYTES,
        )
        self._clusters[key] = client
        while len(self._clusters) > self._max_clusters:
            _, old = self._clusters.popitem(last=False)
            self._retire(old)
        return client

    def _retire(self, client: KubeClient) -> None:
        async def close_later() -> None:
            # A request that picked this client up just now ends within the timeout.
            await asyncio.sleep(2 * self._timeout)
            await client.aclose()

        task = asyncio.create_task(close_later())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        for client in self._clusters.values():
            await client.aclose()
        self._clusters.clear()
        self._entries.clear()
