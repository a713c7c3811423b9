"""The connection report use case: an agent tells the broker its runtime's Compass connection.

Order, cheapest refusals first and identity before anything about the runtime: the body is
validated (by the HTTP layer) → the runtime proven, by the token's chain
(`identity.runtime_proof`: runtime ID, Kyma cache synced, identity, not revoked, policy on the
cached Kyma) → per-runtime rate limit → the mapping exists → record on its status
(`report_rules.record_report`).

The rate limit comes after the identity, not before: checked earlier it would tell an unproven
caller which runtimes report (429 versus 401), and let it spend a runtime's budget.

Holds: no Director call, ever; at most one KCP write per report, none when nothing but the times
changed within the refresh interval; a report is either recorded (or found already recorded) or
answered with an error the agent retries: a 503 when KCP could not be written, never a silent
loss. A runtime without a mapping gets 409 `runtime-not-registered`: the broker creates mappings
only to register, and a runtime without one has never been handed a token by it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from control_plane_broker.connections.report_rules import Limits, Report, record_report
from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    KymaDeleting,
    RateLimited,
    RuntimeNotRegistered,
)
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.identity.verifier import IdentityChecked
from control_plane_broker.overload.rate_limit import RateLimiter
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration.state import Mapping as MappingRecord
from control_plane_broker.settings import ReportSettings
from kubeapi import KubeError

log = logging.getLogger(__name__)


class MappingReader(Protocol):
    def get(self, name: str) -> MappingRecord | None: ...


def report_limits(settings: ReportSettings) -> Limits:
    return Limits(
        refresh_seconds=settings.report_refresh_seconds,
        stale_seconds=settings.report_stale_seconds,
        connect_deadline_seconds=settings.connect_deadline_seconds,
    )


class ConnectionReporter:
    def __init__(
        self,
        *,
        settings: ReportSettings,
        proof: RuntimeProof,
        mappings: MappingReader,
        status: StatusRecorder,
        limiter: RateLimiter,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._proof = proof
        self._mappings = mappings
        self._status = status
        self._limiter = limiter
        self._clock = clock  # monotonic: rate limits
        self._wall = wall  # what the mapping records
        self._limits = report_limits(settings)

    @property
    def next_report_after(self) -> int:
        return self._settings.report_interval_seconds

    async def report(
        self,
        runtime_id: str,
        headers: Mapping[str, str],
        report: Report,
        *,
        identity_checked: IdentityChecked | None = None,
    ) -> bool:
        """Records `report`; returns whether the mapping was written. `identity_checked`: as
        for a token (`issuing.token_issuer.TokenIssuer.issue`)."""
        kyma = await self._proof.proven_kyma(
            runtime_id, headers, endpoint="connection", identity_checked=identity_checked
        )
        wait = self._limiter.try_take(kyma.name, self._clock())
        if wait is not None:
            raise RateLimited(
                f"at most one connection report per {self._settings.report_min_interval_seconds:g}"
                " s for this runtime",
                retry_after=wait,
            )
        mapping = self._mappings.get(kyma.name)
        if mapping is None:
            raise RuntimeNotRegistered("no mapping for this runtime yet: ask for a token first")
        if mapping.deleting:
            raise KymaDeleting("the runtime's mapping is being deleted")
        now = self._wall()
        try:
            written = await self._status.apply_change(
                mapping,
                lambda m: record_report(m, report, now=now, limits=self._limits),
                kyma_uid=kyma.uid,
            )
        except KubeError as exc:
            log.warning(
                "connection report not recorded", extra={"kyma": kyma.name, "error": str(exc)}
            )
            raise ControlPlaneUnavailable(
                "the connection report could not be recorded", retry_after=5
            ) from exc
        log.debug(
            "connection report",
            extra={"kyma": kyma.name, "state": report.state, "written": written},
        )
        return written
