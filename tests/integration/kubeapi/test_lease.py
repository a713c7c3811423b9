"""`LeaderElector` on a real API server, each elector with its own hand-moved monotonic clock:
take-over only after the holder stayed silent for the lease duration *on the taker's clock*,
whatever the holder wrote as renewTime; one winner of a race; release hands over at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kubeapi import KubeClient, LeaderElector
from tests.integration.waiting import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(
    kube: KubeClient, ns: str, identity: str, clock: Clock, **kwargs: object
) -> LeaderElector:
    return LeaderElector(
        kube,
        namespace=ns,
        name="leader",
        identity=identity,
        duration=15.0,
        renew_every=5.0,
        clock=clock,
        **kwargs,  # type: ignore[arg-type]
    )


def lease_path(ns: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/leader"


async def test_the_other_takes_over_only_after_the_duration_on_its_own_clock(
    kube: KubeClient, ns: str
) -> None:
    a_clock, b_clock = Clock(), Clock()
    a, b = elector(kube, ns, "a", a_clock), elector(kube, ns, "b", b_clock)
    assert await a.try_acquire_or_renew()
    assert a.leading
    assert not await b.try_acquire_or_renew()  # b starts counting now, on its own clock
    for _ in range(2):  # a renews twice; b sees each change and restarts its count
        a_clock.now += 5
        b_clock.now += 10
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    # a stops renewing. Just short of 15 s on b's clock: still a's.
    b_clock.now += 14.9
    assert not await b.try_acquire_or_renew()
    b_clock.now += 0.1
    assert await b.try_acquire_or_renew()
    assert b.leading
    lease = await kube.get(lease_path(ns))
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a, whose clock did not move, finds b holding the lease: it is no leader from now on.
    assert a.leading
    assert not await a.try_acquire_or_renew()
    assert not a.leading


async def test_a_holder_with_a_skewed_renew_time_is_judged_by_observation(
    kube: KubeClient, ns: str
) -> None:
    for skewed in ("2999-01-01T00:00:00.000000Z", "1999-01-01T00:00:00.000000Z"):
        name = f"leader-{skewed[:4]}"
        await kube.create(
            f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
            {
                "metadata": {"name": name},
                "spec": {
                    "holderIdentity": "skewed",
                    "leaseDurationSeconds": 15,
                    "renewTime": skewed,
                },
            },
        )
        clock = Clock()
        taker = LeaderElector(
            kube,
            namespace=ns,
            name=name,
            identity="taker",
            duration=15.0,
            renew_every=5.0,
            clock=clock,
        )
        # A renewTime in the past does not make it expired, one in the future not valid:
        # only 15 s without a change, seen on our own clock, does.
        assert not await taker.try_acquire_or_renew()
        clock.now += 14.0
        assert not await taker.try_acquire_or_renew()
        clock.now += 1.0
        assert await taker.try_acquire_or_renew()


async def test_of_two_racing_candidates_exactly_one_wins(kube: KubeClient, ns: str) -> None:
    electors = [elector(kube, ns, f"c{i}", Clock()) for i in range(4)]
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(won) == 1
    lease = await kube.get(lease_path(ns))
    assert lease["spec"]["holderIdentity"] == f"c{won.index(True)}"


async def test_release_hands_over_at_once_and_run_reports_changes(
    kube: KubeClient, ns: str
) -> None:
    changes: list[bool] = []
    a = LeaderElector(
        kube,
        namespace=ns,
        name="leader",
        identity="a",
        duration=15.0,
        renew_every=0.2,
        on_change=changes.append,
    )
    assert not a.decided
    task = asyncio.create_task(a.run())
    try:
        await eventually(lambda: changes == [True], what="a to lead")
        assert a.leading
        assert a.decided
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await a.release()
    assert changes == [True, False]
    assert not a.leading
    lease = await kube.get(lease_path(ns))
    assert lease["spec"].get("holderIdentity") is None
    b = elector(kube, ns, "b", Clock(), wall_clock=lambda: datetime(2030, 1, 1, tzinfo=UTC))
    assert await b.try_acquire_or_renew()  # no wait: the lease was handed back
    lease = await kube.get(lease_path(ns))
    assert lease["spec"]["renewTime"] == "2030-01-01T00:00:00.000000Z"


async def test_a_leader_that_cannot_renew_steps_down_within_the_duration(
    kube: KubeClient, ns: str
) -> None:
    clock = Clock()
    a = elector(kube, ns, "a", clock)
    assert await a.try_acquire_or_renew()
    clock.now += 14.9
    assert a.leading
    clock.now += 0.1
    assert not a.leading  # no renewal for 15 s since the attempt began: others may lead now
