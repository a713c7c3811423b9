"""Access to a runtime's own API server, from its kubeconfig Secret in KCP.

The Secret is found by label `operator.kyma-project.io/kyma-name=<kyma name>` (name
`kubeconfig-<runtime-id>`, data key `config`). Clients are kept for a while so that a burst of
requests reads the Secret once; the kubeconfig text is never logged.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Callable

import httpx

from control_plane_broker.errors import IdentityNotProven
from control_plane_broker.kube.client import KubeClient
from control_plane_broker.kube.config import KubeconfigError, access_from_kubeconfig_text
from control_plane_broker.model import LABEL_KYMA_NAME

KUBECONFIG_DATA_KEY = "config"


class RuntimeAccess:
    def __init__(
        self,
        kcp: KubeClient,
        *,
        namespace: str,
        ttl_seconds: float,
        clock: Callable[[], float],
        timeout: float = 10.0,
        max_entries: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._kcp = kcp
        self._namespace = namespace
        self._ttl = ttl_seconds
        self._clock = clock
        self._timeout = timeout
        self._max = max_entries
        self._transport = transport  # tests plug in here
        self._clients: OrderedDict[str, tuple[float, KubeClient]] = OrderedDict()

    async def client_for(self, kyma_name: str) -> KubeClient:
        now = self._clock()
        entry = self._clients.get(kyma_name)
        if entry is not None and entry[0] > now:
            self._clients.move_to_end(kyma_name)
            return entry[1]
        listing = await self._kcp.get(
            f"/api/v1/namespaces/{self._namespace}/secrets",
            params={"labelSelector": f"{LABEL_KYMA_NAME}={kyma_name}"},
        )
        items = listing.get("items") or []
        data = next(
            (
                i.get("data", {}).get(KUBECONFIG_DATA_KEY)
                for i in items
                if (i.get("data") or {}).get(KUBECONFIG_DATA_KEY)
            ),
            None,
        )
        if not data:
            # Without the runtime's kubeconfig nothing can prove this runtime's identity.
            raise IdentityNotProven("no kubeconfig for this runtime in KCP", reason="no-kubeconfig")
        try:
            access = access_from_kubeconfig_text(base64.b64decode(data).decode())
        except (KubeconfigError, ValueError) as exc:
            raise IdentityNotProven(
                "the runtime kubeconfig is unusable", reason="bad-kubeconfig"
            ) from exc
        client = KubeClient(access, timeout=self._timeout, transport=self._transport)
        if entry is not None:
            await entry[1].aclose()
        self._clients[kyma_name] = (now + self._ttl, client)
        self._clients.move_to_end(kyma_name)
        while len(self._clients) > self._max:
            _, (_, old) = self._clients.popitem(last=False)
            await old.aclose()
        return client

    async def aclose(self) -> None:
        for _, client in self._clients.values():
            await client.aclose()
        self._clients.clear()
