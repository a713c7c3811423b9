"""Issue 35, item 5, on virtual time: a cold start of 200 runtimes against a Director that
takes 3-5 s a call, through the real `DirectorLimiter` (breaker, schedule, slots), with agents
that follow the agent's own retry policy and the Retry-After the broker's problem mapping gives.

The event loop's clock is virtual (nothing sleeps: a timer due in 4 s is due at once), so
the run is exact and takes about a second: the figures are those of the model, with no machine
noise. What it leaves out (the broker's HTTP and KCP work, the first-contact limit) the
integration test (`tests/integration/broker/test_slow_director.py`) and the benchmark
(`python -m bench --scenarios slow`, docs/benchmarks.md section 12) have.

Before admitted calls were sent out of the queue with their place kept (docs/design/0015):
with arrivals over 5-15 s Director idled 30-80 s of the run, in-flight fell to 0 for tens of
seconds, all connected after 1.4-1.5x the bound.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import control_plane_broker.director.graphql_client  # noqa: F401 (the limiter's import cycle)
from agent.retry_policy import RetryPolicy, next_delay
from bench.slow import IN_FLIGHT_TARGET, RATIO_TARGET, Interval, in_flight, latency_bound
from control_plane_broker.api.problems import problem_for
from control_plane_broker.errors import TemporaryError
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.director_limiter import DirectorLimiter
from tests.unit.broker.virtual_time import VirtualLoop

AGENT_TIMEOUT = 30.0
DEADLINE = 25.0  # BROKER_REQUEST_DEADLINE_SECONDS
JITTER = 5.0  # BROKER_RETRY_AFTER_JITTER_SECONDS


async def cold_start(
    *, n: int, slots: int, latency: tuple[float, float], spread: float, seed: int
) -> tuple[float, list[Interval], dict[str, int]]:
    """All n agents ask within `spread` seconds; returns the time the last one got its token,
    Director's calls and the answers the agents got."""
    rng = random.Random(seed)
    clock = asyncio.get_running_loop().time
    limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(failure_threshold=5, open_seconds=5),
        max_concurrency=slots,
        queue_timeout=10.0,
        clock=clock,
    )
    registered: set[str] = set()
    calls: list[Interval] = []
    answers: dict[str, int] = {}

    def director(operation: str) -> Any:
        async def call() -> None:
            start = clock()
            await asyncio.sleep(rng.uniform(*latency))
            calls.append(Interval(start, clock(), operation))

        return call

    async def issue(key: str, gone_at: float) -> None:
        """The request path's use of the limiter (`issuing.token_issuer.TokenIssuer.issue`)."""

        async def present() -> bool:
            return clock() < gone_at

        known = key in registered
        reservation = limiter.reserve(key, calls=1 if known else 2, deadline=clock() + DEADLINE)
        try:
            if not known:
                await limiter.call(
                    director("registerRuntime"), reservation=reservation, subject=key, then=1
                )
                registered.add(key)
            await limiter.call(
                director("requestOneTimeTokenForRuntime"),
                reservation=reservation,
                subject=key,
                follow_up=not known,
                caller_present=present,
            )
        finally:
            limiter.finish(reservation)

    async def agent(key: str) -> float:
        await asyncio.sleep(rng.uniform(0.0, spread))
        policy = RetryPolicy()
        for attempt in range(1, 1000):
            request = asyncio.ensure_future(issue(key, clock() + AGENT_TIMEOUT))
            done, _ = await asyncio.wait({request}, timeout=AGENT_TIMEOUT)
            retry_after = None
            if not done:
                answers["timeout"] = answers.get("timeout", 0) + 1  # the broker goes on
            elif (error := request.exception()) is None:
                answers["201"] = answers.get("201", 0) + 1
                return clock()
            else:
                assert isinstance(error, TemporaryError), error
                problem = problem_for(error, instance="", jitter_max=JITTER, rand=rng.random)
                answers[error.slug] = answers.get(error.slug, 0) + 1
                retry_after = float(problem.headers["Retry-After"])
            await asyncio.sleep(next_delay(policy, attempt, retry_after=retry_after, rng=rng))
        raise AssertionError(f"{key} never got its token")

    done = await asyncio.gather(*(agent(f"rt-{i}") for i in range(n)))
    return max(done), calls, answers


@pytest.mark.parametrize(("seed", "spread"), [(1, 1.0), (2, 1.0), (3, 5.0), (4, 5.0), (5, 15.0)])
def test_a_slow_director_is_kept_busy_while_work_waits(seed: int, spread: float) -> None:
    n, slots, latency = 200, 10, (3.0, 5.0)
    loop = VirtualLoop()
    try:
        last, calls, answers = loop.run_until_complete(
            cold_start(n=n, slots=slots, latency=latency, spread=spread, seed=seed)
        )
    finally:
        loop.close()
    mean = sum(c.end - c.start for c in calls) / len(calls)
    bound = latency_bound(n, latency=mean, slots=slots)
    busy = in_flight(calls, slots=slots)
    print(
        f"\nseed {seed}, arrivals over {spread:.0f} s: all connected after {last:.1f} s, bound "
        f"{bound:.1f} s ({last / bound:.2f}x); in flight worst second {busy.worst:.0%} at "
        f"{busy.worst_at:.0f} s, mean {busy.mean:.0%}; answers {answers}"
    )
    assert answers["201"] == n
    assert len(calls) == 2 * n  # nobody registered twice, no token for nobody
    # Arrivals spread over 15 s leave slots free at the start because the work has not come
    # yet, not because the broker holds it back: the window starts once all have arrived.
    if spread > 5.0:
        busy = in_flight(calls, slots=slots, not_before=spread)
    assert busy.worst >= IN_FLIGHT_TARGET, busy
    assert last <= RATIO_TARGET * bound
