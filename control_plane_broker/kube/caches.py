"""The watch-fed views the request path reads instead of the API server: Kymas and mappings.

Both are `kubeapi.Informer`s: listed once, then kept current by a watch (re-listed after a 410
or a broken stream, deletions missed meanwhile reported). A Kyma or mapping that does not parse
is treated as absent, and the informer goes on.
"""

from __future__ import annotations

from control_plane_broker.backoff import Delay
from control_plane_broker.kyma import KYMA_GROUP, KYMA_VERSION, MAPPING_VERSION, KymaView
from control_plane_broker.registration.state import Mapping
from kubeapi import KubeClient
from kubeapi.informer import Informer


def kyma_informer(client: KubeClient, *, namespace: str, delay: Delay) -> Informer[KymaView]:
    return Informer(
        client,
        f"/apis/{KYMA_GROUP}/{KYMA_VERSION}/namespaces/{namespace}/kymas",
        name="kymas",
        parse=KymaView.from_object,
        delay=delay,
    )


def mapping_informer(client: KubeClient, *, namespace: str, delay: Delay) -> Informer[Mapping]:
    return Informer(
        client,
        f"/apis/{KYMA_GROUP}/{MAPPING_VERSION}/namespaces/{namespace}/compassmanagermappings",
        name="mappings",
        parse=Mapping.from_object,
        delay=delay,
    )
