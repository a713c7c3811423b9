"""The token request use case with its collaborators replaced by recorders (the Director limiter
with its capacity schedule, and the rate limiter, are the real ones): the order of refusals,
what each costs, and that every caller gets its own token."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from control_plane_broker.director.answers import OneTimeToken
from control_plane_broker.director.classification import (
    DirectorInternal,
    DirectorPermanent,
    DirectorRetryable,
)
from control_plane_broker.errors import (
    CallerGone,
    CapacityReserved,
    CompassTenantUnknown,
    CompassUnavailable,
    IdentityNotProven,
    ModuleNotEnabled,
    RateLimited,
    RuntimeApiSilent,
    RuntimeNotFound,
    RuntimeRevoked,
)
from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.issuing.status_later import AfterAnswer
from control_plane_broker.issuing.token_issuer import TokenIssuer
from control_plane_broker.kyma import KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.director_limiter import CallerPresent, DirectorLimiter
from control_plane_broker.overload.rate_limit import BucketPolicy, RateLimiter
from control_plane_broker.overload.reservations import Reservation
from control_plane_broker.registration.service import Registered
from control_plane_broker.registration.state import Mapping as MappingRecord
from control_plane_broker.revocation.revocation_gate import RevocationGate
from control_plane_broker.settings import Settings

GA = "kyma-project.io/global-account-id"
KYMA = KymaView(
    name="rt-1",
    namespace="kcp-system",
    uid="u-1",
    resource_version="1",
    labels={GA: "ga", "kyma-project.io/runtime-id": "RT-1"},
    spec_modules=frozenset({"application-connector"}),
)
REGISTERED = Registered("c-1", "ga", "registered", labels={"kyma_runtime_id": "RT-1"})
KNOWN = Registered("c-1", "ga", "adopted")


@dataclass
class MappingView:
    items: dict[str, MappingRecord]

    def get(self, name: str) -> MappingRecord | None:
        return self.items.get(name)


@dataclass
class EventLog:
    emitted: list[tuple[str, str, str]]

    def emit(self, *, kyma_name: str, kyma_uid: str, reason: str, message: str, **_: Any) -> None:
        self.emitted.append((kyma_name, reason, message))


def revoked_mapping(name: str, reason: str) -> MappingRecord:
    return MappingRecord.from_object(
        {
            "metadata": {
                "name": name,
                "resourceVersion": "7",
                "annotations": {"compass-broker.kyma-project.io/revoked": reason},
            }
        }
    )


@dataclass
class Recorder:
    """Every collaborator of the issuer in one place, recording what it was asked."""

    kymas: dict[str, KymaView] = field(default_factory=lambda: {KYMA.name: KYMA})
    known: Registered | None = None
    refusal: CompassTenantUnknown | None = None
    gone: set[str] = field(default_factory=set)  # Compass IDs Director no longer has
    proof_error: Exception | None = None
    token_error: Exception | None = None
    asked: list[str] = field(default_factory=list)
    tokens: list[tuple[str, str, bool]] = field(default_factory=list)
    statuses: list[tuple[str, Any]] = field(default_factory=list)
    # what each Director call of the request was counted on: (call, reservation)
    reservations: list[tuple[str, Reservation | None]] = field(default_factory=list)
    synced: bool = True
    mapping_view: MappingView = field(default_factory=lambda: MappingView({}))
    events: EventLog = field(default_factory=lambda: EventLog([]))

    # the Kyma view
    def get(self, name: str) -> KymaView | None:
        self.asked.append(f"kyma {name}")
        return self.kymas.get(name)

    # the verifier
    mode = "test"

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        self.asked.append(f"verify {runtime_id}")
        if self.proof_error is not None:
            raise self.proof_error
        return Identity(runtime_id=runtime_id, subject="sa", mode="test")


class Registration:
    def __init__(self, recorder: Recorder) -> None:
        self._r = recorder

    def refused(self, kyma: KymaView) -> CompassTenantUnknown | None:
        return self._r.refusal

    def known(self, kyma: KymaView) -> Registered | None:
        return self._r.known

    async def is_gone(
        self, registered: Registered, *, reservation: Reservation | None = None
    ) -> bool:
        self._r.asked.append(f"runtime {registered.compass_id}")
        self._r.reservations.append(("runtime", reservation))
        return registered.compass_id in self._r.gone

    async def forget(self, name: str, compass_id: str) -> tuple[None, bool]:
        self._r.asked.append(f"forget {compass_id}")
        self._r.known = None
        self._r.token_error = None  # the runtime registered again gets its tokens
        return None, True

    async def ensure_registered(
        self, kyma: KymaView, *, fresh: object = None, reservation: Reservation | None = None
    ) -> Registered:
        self._r.asked.append(f"register {kyma.name}")
        self._r.reservations.append(("register", reservation))
        await asyncio.sleep(0)
        return REGISTERED


class Director:
    def __init__(self, recorder: Recorder) -> None:
        self._r = recorder

    async def request_one_time_token(
        self,
        *,
        tenant: str,
        runtime_id: str,
        reservation: Reservation | None = None,
        follow_up: bool = False,
        caller_present: CallerPresent | None = None,
    ) -> OneTimeToken:
        self._r.reservations.append(("token", reservation))
        await asyncio.sleep(0)
        if caller_present is not None and not await caller_present():
            raise CallerGone("gone")  # what the director_limiter does (test_director.py)
        self._r.asked.append(f"token {runtime_id}")
        if self._r.token_error is not None:
            raise self._r.token_error
        self._r.tokens.append((tenant, runtime_id, follow_up))
        return OneTimeToken.model_validate(
            {"token": f"ott-{len(self._r.tokens)}", "connectorURL": "https://connector.test/"}
        )


class Status:
    def __init__(self, recorder: Recorder) -> None:
        self._r = recorder

    async def issued(self, *, kyma: KymaView, registered: Registered) -> None:
        self._r.statuses.append(("issued", registered))

    async def failed(self, **kwargs: Any) -> bool:
        self._r.statuses.append(("failed", kwargs))
        return True

    async def runtime_lost(self, *, kyma: KymaView, compass_id: str) -> None:
        self._r.statuses.append(("lost", compass_id))

    def now(self) -> float:
        return 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    recorder: Recorder
    issuer: TokenIssuer
    director_limiter: DirectorLimiter
    clock: Clock


def world(
    *,
    burst: int = 5,
    max_concurrency: int = 1,
    queue_timeout: float = 1.0,
    after_answer: AfterAnswer | None = None,
) -> World:
    recorder = Recorder()
    clock = Clock()
    director_limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=1, open_seconds=30),
        max_concurrency=max_concurrency,
        queue_timeout=queue_timeout,
        clock=clock,
    )
    director_limiter.schedule.latency = 0.125  # exact in binary: a call reserves 1/8 s of one slot
    issuer = TokenIssuer(
        request_deadline_seconds=Settings().request_deadline_seconds,
        proof=RuntimeProof(
            cache=recorder,
            verifier=recorder,
            gate=RevocationGate(
                mappings=recorder.mapping_view,
                kymas=recorder,
                events=recorder.events,  # type: ignore[arg-type]
                metrics=Metrics(),
            ),
            module=Settings().module_name,
            module_required=Settings().module_policy == "required",
        ),
        registration=Registration(recorder),  # type: ignore[arg-type]
        director=Director(recorder),  # type: ignore[arg-type]
        director_limiter=director_limiter,
        status=Status(recorder),  # type: ignore[arg-type]
        limiter=RateLimiter(BucketPolicy(burst=burst, per_second=1 / 60)),
        clock=clock,
        after_answer=after_answer,
    )
    return World(recorder, issuer, director_limiter, clock)


HEADERS = {"authorization": "Bearer t"}


async def test_identity_is_proven_before_the_kyma_is_looked_up() -> None:
    w = world()
    w.recorder.proof_error = IdentityNotProven("bad proof", reason="invalid")
    # An unknown runtime with a bad proof: 401 like a known one, nothing learnt about it.
    with pytest.raises(IdentityNotProven):
        await w.issuer.issue("unknown-rt", HEADERS)
    assert w.recorder.asked == ["verify unknown-rt"]
    w.recorder.proof_error = None
    with pytest.raises(RuntimeNotFound):
        await w.issuer.issue("unknown-rt", HEADERS)
    assert w.recorder.asked[-2:] == ["verify unknown-rt", "kyma unknown-rt"]


async def test_the_first_contact_limit_is_told_when_the_identity_check_is_over_passed_or_not() -> (
    None
):
    w = world()

    def checked(*, timed_out: bool) -> None:
        w.recorder.asked.append(f"identity checked, timed out: {timed_out}")

    w.recorder.proof_error = IdentityNotProven("bad proof", reason="invalid")
    with pytest.raises(IdentityNotProven):
        await w.issuer.issue("rt-1", HEADERS, identity_checked=checked)
    assert w.recorder.asked == ["verify rt-1", "identity checked, timed out: False"]
    # The runtime's API server gave no answer: told so, the hold is no measure of the limit.
    w.recorder.proof_error = RuntimeApiSilent("runtime API server unreachable", retry_after=5)
    with pytest.raises(RuntimeApiSilent):
        await w.issuer.issue("rt-1", HEADERS, identity_checked=checked)
    assert w.recorder.asked[2:] == ["verify rt-1", "identity checked, timed out: True"]
    w.recorder.proof_error = None
    await w.issuer.issue("rt-1", HEADERS, identity_checked=checked)
    # Told before anything else happens: the request may now wait for Director for long.
    assert w.recorder.asked[4:6] == ["verify rt-1", "identity checked, timed out: False"]
    assert len(w.recorder.asked) > 6


async def test_policy_refusals_cost_no_capacity_and_no_rate() -> None:
    w = world(burst=1)
    w.recorder.kymas["rt-1"] = KymaView("rt-1", "kcp-system", "u", "1", {GA: "ga"})  # module off
    for _ in range(3):
        with pytest.raises(ModuleNotEnabled):
            await w.issuer.issue("rt-1", HEADERS)
    assert w.director_limiter.schedule.reserved_until == 0.0
    w.recorder.kymas["rt-1"] = KYMA
    w.recorder.known = KNOWN
    await w.issuer.issue("rt-1", HEADERS)  # the one token of the burst is still there


async def test_a_known_runtime_reserves_one_call_and_is_not_registered_again() -> None:
    w = world()
    w.recorder.known = KNOWN
    issued = await w.issuer.issue("RT-1", HEADERS)
    assert (issued.token, issued.compass_runtime_id, issued.tenant) == ("ott-1", "c-1", "ga")
    assert not any(a.startswith("register") for a in w.recorder.asked)
    assert w.recorder.tokens == [("ga", "c-1", False)]
    assert w.director_limiter.schedule.reserved_until == w.clock.now + 0.125  # one call's worth
    assert w.recorder.statuses == [("issued", KNOWN)]


async def test_an_unknown_runtime_reserves_two_calls_and_its_token_follows_up() -> None:
    w = world()
    issued = await w.issuer.issue("rt-1", HEADERS)
    assert "register rt-1" in w.recorder.asked
    assert issued.compass_runtime_id == "c-1"
    assert w.recorder.tokens == [("ga", "c-1", True)]  # served before first calls
    assert w.director_limiter.schedule.reserved_until == w.clock.now + 0.25
    assert w.recorder.statuses == [("issued", REGISTERED)]


async def test_the_registration_and_the_token_are_counted_on_the_requests_one_reservation() -> None:
    w = world()
    arrived = w.clock.now - 2.0
    await w.issuer.issue("rt-1", HEADERS, arrived_at=arrived)
    [(first, registration), (second, token)] = w.recorder.reservations
    assert (first, second) == ("register", "token")
    assert registration is token is not None
    assert (token.key, token.calls) == ("rt-1", 2)
    assert token.deadline == arrived + Settings().request_deadline_seconds
    assert token.finished  # the request is answered: it is out of the queue in front of Director
    assert w.director_limiter._ledger.outstanding == 0


async def test_every_caller_gets_its_own_token() -> None:
    w = world(burst=5, max_concurrency=4)
    w.recorder.known = KNOWN
    issued = await asyncio.gather(*(w.issuer.issue("rt-1", HEADERS) for _ in range(3)))
    assert sorted(i.token for i in issued) == ["ott-1", "ott-2", "ott-3"]
    assert len(w.recorder.tokens) == 3


async def test_an_open_breaker_refuses_with_a_wait_after_the_probe_and_registers_nothing() -> None:
    w = world()

    async def outage() -> None:
        raise DirectorRetryable("503")

    with pytest.raises(DirectorRetryable):
        await w.director_limiter.call(outage)
    assert w.director_limiter.state is cb.State.OPEN
    with pytest.raises(CompassUnavailable) as info:
        await w.issuer.issue("rt-1", HEADERS)
    assert info.value.retry_after == 29  # the probe, told early by the agents' jitter
    assert not info.value.spread
    # Its reservation (after the probe) is kept, so when Director is back it comes then.
    assert w.director_limiter.schedule.reservations() == 1
    assert not any(a.startswith(("register", "token")) for a in w.recorder.asked)


async def test_a_reserved_wait_is_told_before_anything_reaches_director() -> None:
    w = world(queue_timeout=1.0)
    w.recorder.known = KNOWN
    for i in range(9):  # 9 · 1/8 s reserved: the next start is 1.125 s ahead, beyond 1 s
        w.director_limiter.reserve(f"other-{i}", calls=1)
    with pytest.raises(CapacityReserved) as info:
        await w.issuer.issue("rt-1", HEADERS)
    assert info.value.retry_after == 1.0  # the whole second that gets it there by its reservation
    assert w.recorder.tokens == []
    # Back at its reservation: admitted on the reservation it was given.
    w.clock.now += 1.125
    await w.issuer.issue("rt-1", HEADERS)
    assert len(w.recorder.tokens) == 1


async def test_only_issued_tokens_count_against_the_rate_limit() -> None:
    w = world(burst=1)
    w.recorder.known = KNOWN
    w.recorder.token_error = CompassUnavailable("Director down", retry_after=5)
    for _ in range(2):
        with pytest.raises(CompassUnavailable):
            await w.issuer.issue("rt-1", HEADERS)
    failed = [s for s in w.recorder.statuses if s[0] == "failed"]
    assert failed[0][1]["condition"] == "TokenIssued"
    w.recorder.token_error = None
    w.clock.now += 10  # out of the reserved window of the failed attempts
    await w.issuer.issue("rt-1", HEADERS)
    with pytest.raises(RateLimited) as info:
        await w.issuer.issue("rt-1", HEADERS)
    assert info.value.retry_after == pytest.approx(60)


async def test_a_caller_gone_before_its_token_gets_a_registration_but_no_token() -> None:
    """The registration is kept (the agent's next request needs only the token); no token is
    spent, nothing is recorded as a failure on the Kyma, and the rate limit is not charged."""
    w = world(burst=1)
    answers = iter([True, False])  # there when its request is served, gone by its token

    async def leaves() -> bool:
        return next(answers)

    with pytest.raises(CallerGone):
        await w.issuer.issue("rt-1", HEADERS, caller_present=leaves)
    assert "register rt-1" in w.recorder.asked
    assert w.recorder.tokens == []
    assert w.recorder.statuses == []
    w.recorder.known = REGISTERED
    w.clock.now += 10  # past the reserved window

    async def here() -> bool:
        return True

    issued = await w.issuer.issue("rt-1", HEADERS, caller_present=here)
    assert issued.token == "ott-1"


async def test_a_caller_gone_before_its_request_is_served_costs_no_proof_and_no_reservation() -> (
    None
):
    w = world()

    async def gone() -> bool:
        return False

    with pytest.raises(CallerGone):
        await w.issuer.issue("rt-1", HEADERS, caller_present=gone)
    assert w.recorder.asked == []  # not verified, no Kyma looked up
    assert w.director_limiter.schedule.reserved_until == 0.0


async def test_a_revoked_runtime_is_refused_once_proven_and_told_on_its_kyma() -> None:
    w = world()
    w.recorder.mapping_view.items[KYMA.name] = revoked_mapping(KYMA.name, "stolen laptop")
    # Unproven: the same 401 as for any runtime, revocation is no oracle.
    w.recorder.proof_error = IdentityNotProven("bad proof", reason="invalid")
    with pytest.raises(IdentityNotProven):
        await w.issuer.issue("RT-1", HEADERS)
    assert w.recorder.events.emitted == []
    w.recorder.proof_error = None
    with pytest.raises(RuntimeRevoked) as refused:
        await w.issuer.issue("RT-1", HEADERS)
    assert str(refused.value) == "an operator revoked this runtime: stolen laptop"
    assert w.recorder.tokens == []
    assert "register rt-1" not in w.recorder.asked
    [(name, reason, message)] = w.recorder.events.emitted
    assert (name, reason) == ("rt-1", "RuntimeRevoked")
    assert "stolen laptop" in message
    # Un-revoked (the annotation removed): tokens flow again.
    del w.recorder.mapping_view.items[KYMA.name]
    await w.issuer.issue("RT-1", HEADERS)
    assert len(w.recorder.tokens) == 1


async def test_a_runtime_gone_from_director_is_forgotten_and_registered_again_once() -> None:
    w = world()
    w.recorder.known = Registered("dead-id", "ga", "adopted")
    w.recorder.gone = {"dead-id"}
    w.recorder.token_error = DirectorPermanent(
        "requestOneTimeTokenForRuntime: The operation is not allowed [object=systemAuth; "
        "reason=The referenced entity does not exists]",
        code=27,
    )
    issued = await w.issuer.issue("rt-1", HEADERS)
    assert issued.compass_runtime_id == REGISTERED.compass_id
    assert [
        a for a in w.recorder.asked if a.split()[0] in {"token", "runtime", "forget", "register"}
    ] == [
        "token dead-id",
        "runtime dead-id",
        "forget dead-id",
        "register rt-1",
        f"token {REGISTERED.compass_id}",
    ]
    assert ("lost", "dead-id") in w.recorder.statuses
    assert w.director_limiter.state is cb.State.CLOSED


async def test_a_refused_token_for_a_runtime_that_exists_is_not_a_lost_runtime() -> None:
    w = world()
    w.recorder.known = Registered("live-id", "ga", "adopted")
    w.recorder.token_error = DirectorPermanent("requestOneTimeTokenForRuntime: refused", code=27)
    with pytest.raises(DirectorPermanent):
        await w.issuer.issue("rt-1", HEADERS)
    assert "runtime live-id" in w.recorder.asked
    assert not any(a.startswith(("forget", "register")) for a in w.recorder.asked)
    assert w.recorder.statuses[-1][0] == "failed"


async def test_directors_internal_error_on_a_token_is_compass_failing_not_a_lost_runtime() -> None:
    # Its database gone, Director answers code 10: asking whether the runtime is gone would
    # only fail the same way, and the answer is 503 compass-unavailable, not a refusal.
    w = world()
    w.recorder.known = Registered("live-id", "ga", "adopted")
    w.recorder.token_error = DirectorInternal(
        "requestOneTimeTokenForRuntime: Internal Server Error [errorID=e]", maybe_written=True
    )
    with pytest.raises(DirectorInternal) as caught:
        await w.issuer.issue("rt-1", HEADERS)
    assert isinstance(caught.value, CompassUnavailable)
    assert not any(a.startswith(("runtime", "forget", "register")) for a in w.recorder.asked)
    assert w.recorder.statuses[-1][0] == "failed"


async def test_a_remembered_tenant_refusal_costs_no_director_call_and_no_capacity() -> None:
    w = world(max_concurrency=1)
    w.recorder.refusal = CompassTenantUnknown(
        "Compass does not know the subaccount 'sa'",
        label="kyma-project.io/subaccount-id",
        value="sa",
    )
    for _ in range(3):
        with pytest.raises(CompassTenantUnknown):
            await w.issuer.issue("rt-1", HEADERS)
    assert not any(a.startswith(("token", "register")) for a in w.recorder.asked)
    assert w.director_limiter.schedule.reservations() == 0


async def test_a_request_that_spent_its_time_in_front_is_deferred_before_any_call() -> None:
    """The deadline counts from the request's arrival in the broker: a request that waited at
    the first-contact limit and in its identity check until its caller nearly gives up is told
    to come back (with a reservation) instead of being admitted into calls it cannot wait for."""
    w = world()
    deadline = Settings().request_deadline_seconds
    with pytest.raises(CapacityReserved):
        await w.issuer.issue("rt-1", HEADERS, arrived_at=w.clock.now - deadline + 0.1)
    assert not any(a.startswith(("register", "token")) for a in w.recorder.asked)
    assert w.director_limiter.schedule.reservations() == 1
    # Arrived just now (it came back, known and proven recently): admitted on its reservation.
    issued = await w.issuer.issue("rt-1", HEADERS, arrived_at=w.clock.now)
    assert issued.token == "ott-1"


class Later:
    """What `after_answer` was given, to run when the test says; `full` refuses like a full
    queue of deferred writes."""

    def __init__(self, *, full: bool = False) -> None:
        self.writes: list[Callable[[], Awaitable[object]]] = []
        self.full = full

    def take(self, write: Callable[[], Awaitable[object]]) -> bool:
        if self.full:
            return False
        self.writes.append(write)
        return True

    async def run_all(self) -> None:
        for write in self.writes:
            await write()


async def test_the_status_is_written_after_the_answer_when_the_caller_can_run_work_then() -> None:
    later = Later()
    w = world(after_answer=later.take)
    issued = await w.issuer.issue("rt-1", HEADERS)
    assert issued.token == "ott-1"
    assert w.recorder.statuses == []  # the answer did not wait for the mapping's status
    assert len(later.writes) == 1
    await later.run_all()
    assert w.recorder.statuses == [("issued", REGISTERED)]


async def test_a_failure_status_is_written_later_too_and_the_caller_told_at_once() -> None:
    later = Later()
    w = world(after_answer=later.take)
    w.recorder.token_error = CompassUnavailable("Director is down", retry_after=30)
    with pytest.raises(CompassUnavailable):
        await w.issuer.issue("rt-1", HEADERS)
    assert w.recorder.statuses == []
    await later.run_all()
    assert [(s[0], s[1]["condition"]) for s in w.recorder.statuses] == [("failed", "TokenIssued")]


async def test_a_status_the_deferred_writes_cannot_take_is_logged_not_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world(after_answer=Later(full=True).take)
    issued = await w.issuer.issue("rt-1", HEADERS)
    assert issued.token == "ott-1"
    assert w.recorder.statuses == []
    assert "mapping status not written" in caplog.text
