"""Issue 35, item 5, against the broker process and the Compass simulator: while runtimes wait
for their registration, a slow Director is kept busy, and the fleet is served in the time its
latency allows.

150 runtimes start cold at once (the agent's own client, Retry-After honoured); every Director
call takes 3-5 s (the simulator's `Latency` fault on its Director endpoint), Director serves
any number at once, the broker holds 10 calls (`BROKER_DIRECTOR_MAX_CONCURRENCY`), every other
setting at its default: issue 35's measurement at 150 runtimes. The schedule's estimate of a
call starts at 0.1 s, so the herd is admitted whole before the first call ends. In the
virtual-time model of this run (`tests/unit/broker/test_slow_director.py` has the 200-runtime
case) the code before the fix left Director with no call in flight for tens of seconds and
took up to 1.64x the bound.

Director's calls in flight are read from the simulator's own log (each call from its answer's
time less its duration), per second, from the first call while at least 10 runtimes still wait
for their registration (`bench.slow.in_flight`). The target is 80 % of the slots in every such
second, and the benchmark holds it (`python -m bench --scenarios slow`, docs/benchmarks.md
section 12). Here, on two cores shared with the test's own agents, simulator and API servers
(and whatever else the machine runs), the broker's event loop can stall for a second or two
(its lease renewal times out): that costs a second or two below the target, while the failure
this test is about costs tens of seconds with nothing in flight. So it asserts the mean over the
window at the target, no two seconds in a row below half the slots, and the time within 1.15x
the bound plus a start-up allowance; every figure is printed (`-s`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime

import httpx
import pytest

from agent.broker_client import BrokerClient
from agent.outcomes import Issued
from agent.retry_policy import DEFAULT_POLICY
from bench.fleet import StaticIdentity
from bench.prometheus import unlabelled_samples
from bench.scenarios import CERTAINLY_NEW_AFTER
from bench.slow import IN_FLIGHT_TARGET, RATIO_TARGET, in_flight, intervals, latency_bound
from devenv.clusters import TestCluster
from devenv.compass_sim import CompassSimulator
from devenv.compass_sim.faults import Faults, Latency
from tests.integration.broker.conftest import BrokerFactory, seed_runtime, wait_for

N = 150
SLOTS = 10
LATENCY = (3.0, 5.0)
# The fleet's start before Director's first call: 150 first contacts through the first-contact
# limit and their TokenReviews, on two cores shared with the test's own agents and simulator.
# The bound does not count it; on a busy machine it is seconds, so it is allowed for apart.
START_ALLOWANCE = 5.0

pytestmark = pytest.mark.timeout(480)


async def _fleet(url: str, runtimes: list[tuple[str, str]]) -> dict[str, float]:
    """Each runtime's agent pulls its token (the agent's client and retry policy); returns
    when each got it, seconds after the start."""
    limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
    transport = httpx.AsyncHTTPTransport(limits=limits)
    started = time.monotonic()
    done: dict[str, float] = {}

    async def one(runtime_id: str, token: str) -> None:
        client = BrokerClient(
            base_url=url,
            identity=StaticIdentity(token),
            policy=DEFAULT_POLICY,
            timeout=30.0,
            transport=transport,
            clock=lambda: datetime.now(UTC),
        )
        outcome = await client.pull(runtime_id)
        assert isinstance(outcome, Issued), outcome
        done[runtime_id] = time.monotonic() - started

    try:
        await asyncio.wait_for(
            asyncio.gather(*(one(rid, tok) for rid, tok in runtimes)), timeout=300
        )
    finally:
        await transport.aclose()
    return done


def test_a_slow_director_is_kept_busy_while_runtimes_wait(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    sim: CompassSimulator,
) -> None:
    broker = brokers(
        BROKER_IDENTITY_MODE="tokenreview",
        BROKER_DIRECTOR_MAX_CONCURRENCY=str(SLOTS),
        # the defaults, where the broker tests' own settings differ
        BROKER_DIRECTOR_TIMEOUT_SECONDS="10",
        BROKER_RETRY_AFTER_JITTER_SECONDS="5",
        BROKER_LOG_LEVEL="INFO",
    )
    # The Kymas arrive while the broker runs, as new runtimes do: a Kyma created after its
    # mapping watch listed is certainly new and registers without a look-up (one older than
    # the broker is looked up first, two calls more per runtime).
    time.sleep(CERTAINLY_NEW_AFTER)
    runtimes = [seed_runtime(control_plane, kcp_ns, runtime_a) for _ in range(N)]
    tokens = [(rt.runtime_id, rt.token()) for rt in runtimes]
    wait_for(
        lambda: unlabelled_samples(broker.metrics()).get("broker_kymas_cached", 0.0) >= N,
        timeout=60,
        what=f"the broker's cache to hold {N} Kymas",
    )
    low, high = LATENCY
    sim.set_faults(
        Faults(
            latency=Latency(
                fixed_seconds=low, jitter_seconds=high - low, endpoints=frozenset({"director"})
            )
        )
    )
    since = max((r.seq for r in sim.request_log()), default=0)
    wall_start = time.time()
    done = asyncio.run(_fleet(broker.url, tokens))
    records = [
        r
        for r in sim.request_log(since_seq=since)
        if r.endpoint == "director" and r.at.timestamp() >= wall_start
    ]
    calls = intervals((r.at.timestamp(), r.duration_seconds, r.operation) for r in records)
    mean = sum(c.end - c.start for c in calls) / len(calls)
    bound = latency_bound(N, latency=mean, slots=SLOTS)
    busy = in_flight(calls, slots=SLOTS)
    last = max(done.values())
    by_operation = dict(Counter(c.operation for c in calls))
    print(
        f"\n{N} runtimes, Director {low}-{high} s a call (mean {mean:.2f} s), {SLOTS} slots: all "
        f"connected after {last:.1f} s, bound {bound:.1f} s ({last / bound:.2f}x); in flight "
        f"from {busy.window_from - wall_start:.1f} s to {busy.window_to - wall_start:.1f} s: "
        f"worst second {busy.worst:.0%} at {busy.worst_at - wall_start:.0f} s, "
        f"{busy.at_target:.0%} of the seconds at {IN_FLIGHT_TARGET:.0%} or more, mean "
        f"{busy.mean:.0%}; Director calls {by_operation}"
    )
    assert len(done) == N
    assert by_operation == {"registerRuntime": N, "requestOneTimeTokenForRuntime": N}
    # See the module docstring: the mean at the target, and no idle stretch.
    assert busy.mean >= IN_FLIGHT_TARGET, busy
    assert not any(
        a < 0.5 and b < 0.5 for a, b in zip(busy.series, busy.series[1:], strict=False)
    ), busy
    assert last <= RATIO_TARGET * bound + START_ALLOWANCE
    logs = broker.logs()
    assert not [e for e in logs if e.get("level") == "warning" and "breaker" in e], logs[-5:]
