"""The one chain that proves a runtime (`identity.runtime_proof`), as both endpoints use it:
cheapest refusals first, nothing about the runtime read before its identity is proven, the
endpoint's name reaching the revocation gate, the caller's presence checked only where given."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from control_plane_broker.errors import (
    CallerGone,
    IdentityNotProven,
    KymaDeleting,
    MalformedRequest,
    ModuleNotEnabled,
    NotReady,
    RuntimeNotFound,
    RuntimeRevoked,
)
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.kyma import LABEL_GLOBAL_ACCOUNT, KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.registration.state import Mapping as MappingRecord
from control_plane_broker.revocation.revocation_gate import RevocationGate
from tests.unit.broker.mapping_views import mapping_view


class Steps:
    """Cache, verifier and mapping view at once; records what the chain asked, in order."""

    mode = "tokenreview"

    def __init__(self, kyma: KymaView | None) -> None:
        self.synced = True
        self.kyma = kyma
        self.proof_error: Exception | None = None
        self.revoked = False
        self.asked: list[str] = []

    def get(self, name: str) -> KymaView | None:
        self.asked.append(f"kyma {name}")
        return self.kyma

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        self.asked.append(f"verify {runtime_id}")
        if self.proof_error is not None:
            raise self.proof_error
        return Identity(runtime_id=runtime_id, subject="sa", mode=self.mode)


class Mappings:
    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    def get(self, name: str) -> MappingRecord | None:
        self._steps.asked.append(f"mapping {name}")
        if not self._steps.revoked:
            return None
        return dataclasses.replace(mapping_view(), revoked="")


class Events:
    def emit(self, **_: object) -> None:
        pass


def kyma(*, deleting: bool = False, modules: frozenset[str] = frozenset({"m"})) -> KymaView:
    return KymaView(
        name="rt-1",
        namespace="kcp-system",
        uid="u1",
        resource_version="1",
        labels={LABEL_GLOBAL_ACCOUNT: "ga"},
        deleting=deleting,
        spec_modules=modules,
    )


def chain(steps: Steps, *, metrics: Metrics | None = None, required: bool = True) -> RuntimeProof:
    gate = RevocationGate(
        mappings=Mappings(steps),
        kymas=steps,
        events=Events(),  # type: ignore[arg-type]
        metrics=metrics or Metrics(),
    )
    return RuntimeProof(
        cache=steps, verifier=steps, gate=gate, module="m", module_required=required
    )


HEADERS = {"authorization": "Bearer t"}


async def test_a_proven_allowed_runtime_gets_its_kyma_identity_first() -> None:
    steps = Steps(kyma())
    found = await chain(steps).proven_kyma("RT-1", HEADERS, endpoint="token")
    assert found == kyma()
    assert steps.asked == ["verify RT-1", "mapping rt-1", "kyma rt-1"]


async def test_a_malformed_runtime_id_is_refused_before_anything_is_read() -> None:
    steps = Steps(kyma())
    with pytest.raises(MalformedRequest):
        await chain(steps).proven_kyma("rt/1", HEADERS, endpoint="token")
    assert steps.asked == []


async def test_an_unsynced_cache_is_not_ready_and_proves_nothing() -> None:
    steps = Steps(kyma())
    steps.synced = False
    with pytest.raises(NotReady):
        await chain(steps).proven_kyma("rt-1", HEADERS, endpoint="connection")
    assert steps.asked == []


async def test_a_caller_gone_costs_no_identity_check() -> None:
    steps = Steps(kyma())

    async def gone() -> bool:
        return False

    with pytest.raises(CallerGone):
        await chain(steps).proven_kyma("rt-1", HEADERS, endpoint="token", caller_present=gone)
    assert steps.asked == []


async def test_a_bad_proof_learns_nothing_about_the_runtime_and_is_told_checked() -> None:
    steps = Steps(None)
    steps.proof_error = IdentityNotProven("bad proof", reason="invalid")
    told: list[bool] = []

    def checked(*, timed_out: bool) -> None:
        told.append(timed_out)

    with pytest.raises(IdentityNotProven):
        await chain(steps).proven_kyma(
            "rt-1", HEADERS, endpoint="connection", identity_checked=checked
        )
    assert steps.asked == ["verify rt-1"]
    assert told == [False]


@pytest.mark.parametrize("endpoint", ["token", "connection"])
async def test_a_revoked_runtime_is_refused_under_its_endpoint(endpoint: str) -> None:
    steps = Steps(kyma())
    steps.revoked = True
    metrics = Metrics()
    with pytest.raises(RuntimeRevoked):
        await chain(steps, metrics=metrics).proven_kyma(
            "rt-1",
            HEADERS,
            endpoint=endpoint,  # type: ignore[arg-type]
        )
    refused = {
        s.labels["endpoint"]: s.value
        for metric in metrics.revoked_refusals.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert refused == {endpoint: 1.0}


@pytest.mark.parametrize(
    ("found", "refusal"),
    [
        (None, RuntimeNotFound),
        (kyma(deleting=True), KymaDeleting),
        (kyma(modules=frozenset()), ModuleNotEnabled),
    ],
)
async def test_the_policy_refuses_after_the_proof(
    found: KymaView | None, refusal: type[Exception]
) -> None:
    steps = Steps(found)
    with pytest.raises(refusal):
        await chain(steps).proven_kyma("rt-1", HEADERS, endpoint="token")
    assert steps.asked[0] == "verify rt-1"


async def test_a_module_not_required_lets_a_kyma_without_it_through() -> None:
    steps = Steps(kyma(modules=frozenset()))
    found = await chain(steps, required=False).proven_kyma("rt-1", HEADERS, endpoint="token")
    assert found.name == "rt-1"
