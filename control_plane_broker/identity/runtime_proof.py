"""The one chain that proves a runtime, for the token and the report endpoint alike.

Order, cheapest refusals first: validate the runtime ID → the Kyma cache is synced → the caller
still waits (where the endpoint can tell) → prove the identity → not revoked → policy on the
cached Kyma. What differs between the endpoints is a parameter: the endpoint's name (a metric
label of the revocation gate) and whether the caller's presence is checked.

Holds: identity before existence, so who cannot prove to be a runtime learns nothing about it
(an unknown runtime and a bad proof are both 401), nor whether it is revoked; nothing but the
cache is read before the identity is proven.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from control_plane_broker.errors import CallerGone, NotReady
from control_plane_broker.identity.verifier import IdentityChecked, Verifier, prove
from control_plane_broker.kyma import KymaView
from control_plane_broker.overload.director_limiter import CallerPresent
from control_plane_broker.policy import check_token_allowed, validate_runtime_id
from control_plane_broker.revocation.revocation_gate import RevocationGate


class KymaReader(Protocol):
    """What the request path needs of the Kyma cache (watch-fed; no API call per request)."""

    @property
    def synced(self) -> bool: ...

    def get(self, name: str) -> KymaView | None: ...


class RuntimeProof:
    def __init__(
        self,
        *,
        cache: KymaReader,
        verifier: Verifier,
        gate: RevocationGate,
        module: str,
        module_required: bool,
    ) -> None:
        """`module`, `module_required`: the policy on the Kyma (`policy.check_token_allowed`),
        the same for both endpoints."""
        self._cache = cache
        self._verifier = verifier
        self._gate = gate
        self._module = module
        self._module_required = module_required

    async def proven_kyma(
        self,
        runtime_id: str,
        headers: Mapping[str, str],
        *,
        endpoint: Literal["token", "connection"],
        caller_present: CallerPresent | None = None,
        identity_checked: IdentityChecked | None = None,
    ) -> KymaView:
        """The Kyma the caller proved to be and the policy allows, or the refusal.
        `caller_present`: whether the caller still waits; a request whose caller is gone
        costs no identity check. `identity_checked`: told once the check is over
        (`identity.verifier.prove`)."""
        kyma_name = validate_runtime_id(runtime_id)
        if not self._cache.synced:
            raise NotReady("the Kyma cache has not synced yet", retry_after=2)
        if caller_present is not None and not await caller_present():
            raise CallerGone("the caller hung up before its request was served")
        # Identity before existence: who cannot prove to be this runtime learns nothing about it.
        identity = await prove(
            self._verifier, runtime_id=runtime_id, headers=headers, checked=identity_checked
        )
        self._gate.check(kyma_name, identity, endpoint=endpoint)
        return check_token_allowed(
            self._cache.get(kyma_name), module=self._module, module_required=self._module_required
        )
