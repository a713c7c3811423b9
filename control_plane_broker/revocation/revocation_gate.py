"""Refuses a revoked runtime (see `revocation_rules`): counted, logged and told on its Kyma.

Called by the token and report paths right after the caller proved to be the runtime, so an
unproven caller keeps getting 401 and cannot learn whether a runtime is revoked.
"""

from __future__ import annotations

import logging
from typing import Protocol

from control_plane_broker.errors import RuntimeRevoked
from control_plane_broker.identity.claims import Identity
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kyma import KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.registration.state import Mapping
from control_plane_broker.revocation.revocation_rules import revoked

log = logging.getLogger(__name__)

EVENT_REVOKED = "RuntimeRevoked"


class DenyListSource(Protocol):
    def hashes(self) -> frozenset[str]: ...


class MappingLookup(Protocol):
    def get(self, name: str) -> Mapping | None: ...


class KymaLookup(Protocol):
    def get(self, name: str) -> KymaView | None: ...


class RevocationGate:
    def __init__(
        self,
        *,
        mappings: MappingLookup,
        kymas: KymaLookup,
        events: KymaEvents,
        metrics: Metrics,
        deny_list: DenyListSource | None = None,
    ) -> None:
        self._mappings = mappings
        self._kymas = kymas
        self._events = events
        self._metrics = metrics
        self._deny_list = deny_list

    def check(self, kyma_name: str, identity: Identity, *, endpoint: str) -> None:
        """Raises `RuntimeRevoked` for a revoked runtime; `endpoint` (token | connection) is a
        metric label."""
        deny = self._deny_list.hashes() if self._deny_list is not None else frozenset()
        found = revoked(
            self._mappings.get(kyma_name), certificate_hash=identity.certificate_hash, deny=deny
        )
        if found is None:
            return
        self._metrics.revoked_refusals.labels(endpoint, found.source).inc()
        log.info(
            "revoked runtime refused",
            extra={"kyma": kyma_name, "endpoint": endpoint, "source": found.source},
        )
        kyma = self._kymas.get(kyma_name)
        if kyma is not None:
            # One message per revocation, whichever endpoint was refused: the recorder
            # aggregates the repeats into one Event with a count.
            self._events.emit(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                reason=EVENT_REVOKED,
                message=f"request refused: {found.detail}",
                warning=True,
            )
        raise RuntimeRevoked(found.detail, source=found.source)
