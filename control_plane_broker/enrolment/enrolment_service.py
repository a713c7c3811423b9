"""BYOC enrolment, the use case: identity for a runtime that has no kubeconfig Secret in KCP, by
a double opt-in of its ServiceAccount issuer (the rules are in `enrolment_rules`); it writes the
pending issuer on the mapping and the Event that asks an operator to approve it.

Wraps the mode's verifier. Only when that one finds no kubeconfig Secret for the runtime, and a
Kyma for it exists (not deleting, module enabled when the policy requires it), does this look at
the token's unverified issuer and the runtime's mapping (the watch-fed view):

- the approved issuer presented: the token is verified as in `jwks` mode, with keys from that
  issuer's OIDC discovery (`JwksVerifier.verify_with_issuer`: cached, refetched on an unknown key
  id and when old, so the cluster can rotate its keys);
- anything else: the issuer is recorded as pending when none is (creating the mapping without a
  claim if there is none yet), a Warning Event `EnrolmentPending` on the Kyma tells the operator
  the one command that approves it, and the caller gets 403 `enrolment-pending`.

What always holds: the broker contacts no issuer an operator has not approved (the URL comes from
unauthenticated input); it never writes an approval; it tries the pending write at most once
per observed version of the mapping (only when none is pending), and Events beyond those writes
at most once per `event_interval` per runtime, so callers who prove nothing cannot make it write
much; a runtime that has a kubeconfig Secret is never judged here; an unknown runtime is refused
exactly as before (401).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from control_plane_broker.enrolment import enrolment_rules
from control_plane_broker.enrolment.enrolment_rules import AwaitApproval, Enrolment
from control_plane_broker.errors import EnrolmentPending, IdentityNotProven
from control_plane_broker.identity import claims
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.verifier import Verifier
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kyma import KymaView
from control_plane_broker.policy import module_enabled
from control_plane_broker.registration import state
from kubeapi import Conflict, KubeError

log = logging.getLogger(__name__)

EVENT_INTERVAL_SECONDS = 60.0
MAX_TRACKED_RUNTIMES = 10_000
_T = TypeVar("_T")


class KymaLookup(Protocol):
    def get(self, name: str) -> KymaView | None: ...


class MappingLookup(Protocol):
    def get(self, name: str) -> state.Mapping | None: ...


class EnrolmentVerifier:
    def __init__(
        self,
        inner: Verifier,
        *,
        pinned: JwksVerifier,
        kymas: KymaLookup,
        mappings: MappingLookup,
        repo: MappingRepository,
        events: KymaEvents,
        namespace: str,
        audience: str,
        allowed: frozenset[tuple[str, str]],
        required_module: str | None,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
        event_interval: float = EVENT_INTERVAL_SECONDS,
    ) -> None:
        self._inner = inner
        self._pinned = pinned
        self._kymas = kymas
        self._mappings = mappings
        self._repo = repo
        self._events = events
        self._namespace = namespace
        self._audience = audience
        self._allowed = allowed
        self._module = required_module
        self._clock = clock  # monotonic: only paces Events
        self._wall = wall  # epoch seconds: token expiry, the pending annotation's time
        self._interval = event_interval
        # Kyma name → the mapping version a pending write was last tried on; → last Event.
        self._written_on: OrderedDict[str, str] = OrderedDict()
        self._evented: OrderedDict[str, float] = OrderedDict()
        self.mode = inner.mode

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        try:
            return await self._inner.verify(runtime_id=runtime_id, headers=headers)
        except IdentityNotProven as exc:
            if exc.reason != "no-kubeconfig":
                raise
            kyma = self._kymas.get(runtime_id.lower())
            if kyma is None or not self._may_enrol(kyma):
                raise  # as without enrolment: nobody learns which runtimes exist
        token = claims.bearer_token(headers.get("authorization"))
        mapping = self._mappings.get(kyma.name)
        enrolment = Enrolment(
            approved=mapping.issuer_approved if mapping else None,
            pending=mapping.issuer_pending if mapping else None,
        )
        verify = enrolment_rules.decide(enrolment_rules.claimed_issuer(token), enrolment)
        if verify is not None:
            # The approved issuer's keys decide, with the same refusals as `jwks` mode.
            return await self._pinned.verify_with_issuer(
                runtime_id=runtime_id, token=token, issuer=verify.issuer
            )
        presented = enrolment_rules.presented_issuer(
            token, audience=self._audience, allowed=self._allowed, now=self._wall()
        )
        step = enrolment_rules.await_approval(presented, enrolment)
        await self._ask_for_approval(kyma, mapping, step)
        raise EnrolmentPending(enrolment_rules.refusal_detail(step))

    def _may_enrol(self, kyma: KymaView) -> bool:
        # A Kyma that could not get a token anyway gets no mapping written for it.
        return not kyma.deleting and (self._module is None or module_enabled(kyma, self._module))

    async def _ask_for_approval(
        self, kyma: KymaView, mapping: state.Mapping | None, step: AwaitApproval
    ) -> None:
        observed = mapping.resource_version if mapping else ""
        wrote = enrolment_rules.should_record(
            step, observed=observed, last_written_on=self._written_on.get(kyma.name)
        )
        if wrote:
            _remember(self._written_on, kyma.name, observed)
            await self._record_pending(kyma, mapping, step.presented)
        now = self._clock()
        if not wrote and not enrolment_rules.due(self._evented.get(kyma.name), now, self._interval):
            return
        _remember(self._evented, kyma.name, now)
        self._events.emit(
            kyma_name=kyma.name,
            kyma_uid=kyma.uid,
            reason="EnrolmentPending",
            message=enrolment_rules.event_message(step, namespace=self._namespace, name=kyma.name),
            warning=True,
        )

    async def _record_pending(
        self, kyma: KymaView, mapping: state.Mapping | None, issuer: str
    ) -> None:
        try:
            try:
                await self._write_pending(kyma, mapping, issuer)
            except Conflict:
                # The view was behind (our own create, a claim, an operator): judge once more
                # on the mapping as it is now, so the record does not wait for another caller.
                fresh = await self._repo.get(kyma.name)
                if fresh is None or not _still_to_record(fresh, issuer):
                    return
                _remember(self._written_on, kyma.name, fresh.resource_version)
                await self._write_pending(kyma, fresh, issuer)
        except KubeError as exc:
            log.warning(
                "pending issuer not recorded",
                extra={"kyma": kyma.name, "error": type(exc).__name__},
            )
            return
        log.info("issuer pending approval", extra={"kyma": kyma.name, "issuer": issuer})

    async def _write_pending(
        self, kyma: KymaView, mapping: state.Mapping | None, issuer: str
    ) -> None:
        now = self._wall()
        if mapping is None:
            await self._repo.create(
                state.new_pending_mapping(kyma, namespace=self._namespace, issuer=issuer, now=now)
            )
        elif not mapping.deleting:
            # Conditional on the observed resourceVersion: an approval or a claim written
            # meanwhile is never overwritten.
            await self._repo.replace(state.with_pending_issuer(mapping, issuer=issuer, now=now))


def _still_to_record(mapping: state.Mapping, issuer: str) -> bool:
    enrolment = Enrolment(approved=mapping.issuer_approved, pending=mapping.issuer_pending)
    return (
        enrolment_rules.decide(issuer, enrolment) is None
        and enrolment_rules.await_approval(issuer, enrolment).record
    )


def _remember(seen: OrderedDict[str, _T], key: str, value: _T) -> None:
    seen[key] = value
    seen.move_to_end(key)
    while len(seen) > MAX_TRACKED_RUNTIMES:
        seen.popitem(last=False)
