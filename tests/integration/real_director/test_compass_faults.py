"""The real Compass Director failing as it really fails, during a cold start of a fleet.

A fleet of runtimes asks the broker for tokens as compass-agents do (each retries until it gets
201, honouring Retry-After), while Director's PostgreSQL stops, the token endpoint refuses the
broker's credentials, or Director's database sessions are cut again and again. Whatever Compass
does, a runtime is never refused (no 502 `compass-rejected`), every answer but a token says when
to come back (429 or 503 with Retry-After), every runtime connects soon after the fault ends,
and none is registered twice: Director's own database is the judge (one runtime per Kyma, by our
label `kyma_runtime_id`).

Time limits are generous bounds, not measurements.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import httpx
import pytest

from agent.retry_policy import RetryPolicy, next_delay
from devenv.clusters import TestCluster
from devenv.real_director import RealCompass
from tests.integration.broker.conftest import (
    Broker,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)
from tests.integration.real_director import test_broker_real_director as broker_tests
from tests.integration.real_director.test_broker_real_director import (
    PROBLEM,
    RUNTIME_ID_LABEL,
    SUBACCOUNT,
)

# The broker as the other real-Director tests start it: their fixtures, under their names.
kcp_ns = broker_tests.kcp_ns
real_brokers = broker_tests.real_brokers

pytestmark = pytest.mark.timeout(300)

REJECTED = PROBLEM + "compass-rejected"
RETRY_CAP = 10.0  # an agent waits at most this long between two requests here
TRANSPORT_ERROR = 0  # the status recorded when no answer came


# --- the fleet --------------------------------------------------------------------------------


def seed_fleet(
    real_compass: RealCompass, kcp: TestCluster, ns: str, cluster: TestCluster, n: int
) -> list[Runtime]:
    """n Kymas in KCP whose global accounts and subaccounts Director knows (one psql run for
    the tenants, as the tenant fetcher would have synced them)."""
    # Fewer threads than the Kubernetes client's connection pool (10).
    with ThreadPoolExecutor(max_workers=8) as pool:
        fleet = list(pool.map(lambda _: seed_runtime(kcp, ns, cluster), range(n)))
    subaccounts = {}
    for runtime in fleet:
        kyma = runtime.kyma()
        assert kyma is not None
        subaccounts[kyma["metadata"]["labels"][SUBACCOUNT]] = runtime.tenant
    real_compass.add_tenants(subaccounts)
    return fleet


@dataclass(frozen=True)
class Answer:
    at: float  # time.monotonic()
    status: int  # TRANSPORT_ERROR when none came
    problem: str | None  # the problem type, for an error answer
    retry_after: float | None = None  # seconds, when the answer said when to come back


@dataclass
class Agent:
    """One runtime asking for its token until it gets one."""

    runtime: Runtime
    bearer: str
    answers: list[Answer] = field(default_factory=list)
    compass_runtime_id: str | None = None
    connected_at: float | None = None


class Fleet:
    """Agents asking a broker for tokens from threads of their own, as compass-agent does: a
    201 ends an agent's asking; otherwise it waits the answer's Retry-After (at most
    `RETRY_CAP`), or backs off exponentially up to the cap without one, and asks again.

    `with Fleet(...)` starts it and stops it (joining every thread) on the way out."""

    def __init__(self, broker: Broker, runtimes: list[Runtime]) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            bearers = list(pool.map(lambda r: r.token(seconds=1800), runtimes))
        self.broker = broker
        self.agents = [Agent(r, b) for r, b in zip(runtimes, bearers, strict=True)]
        self._policy = RetryPolicy(base=0.5, cap=RETRY_CAP)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._http = httpx.Client(
            timeout=35.0,  # above the broker's own request deadline (25 s)
            limits=httpx.Limits(max_connections=len(runtimes), max_keepalive_connections=0),
        )

    def __enter__(self) -> Self:
        for agent in self.agents:
            thread = threading.Thread(target=self._ask, args=(agent,), daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(40)
        self._http.close()

    def _ask(self, agent: Agent) -> None:
        url = f"{self.broker.url}/v1/runtimes/{agent.runtime.runtime_id}/token"
        headers = {"Authorization": f"Bearer {agent.bearer}"}
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            retry_after: float | None = None
            try:
                response = self._http.post(url, headers=headers)
            except httpx.HTTPError:
                answer = Answer(time.monotonic(), TRANSPORT_ERROR, None)
            else:
                problem = None
                if response.status_code != 201:
                    try:
                        problem = response.json().get("type")
                    except ValueError:
                        problem = f"(not JSON: {response.text[:80]!r})"
                    if response.headers.get("Retry-After", "").isdigit():
                        retry_after = float(response.headers["Retry-After"])
                answer = Answer(time.monotonic(), response.status_code, problem, retry_after)
            with self._lock:
                agent.answers.append(answer)
                if answer.status == 201:
                    agent.compass_runtime_id = response.json()["compassRuntimeID"]
                    agent.connected_at = answer.at
                    return
            delay = next_delay(self._policy, attempt, retry_after=retry_after)
            self._stop.wait(min(delay, RETRY_CAP))

    # -- what happened ---------------------------------------------------------------------

    def connected(self) -> int:
        with self._lock:
            return sum(1 for a in self.agents if a.connected_at is not None)

    def waiting(self) -> list[str]:
        with self._lock:
            return [a.runtime.runtime_id for a in self.agents if a.connected_at is None]

    def wait_all(self, timeout: float) -> bool:
        """Whether every agent got its token within `timeout` seconds from now."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.connected() == len(self.agents)

    def answers(
        self, where: Callable[[Answer], bool] = lambda _: True
    ) -> Counter[tuple[int, str | None]]:
        """The answers the fleet got (those `where` holds for), counted by (status, problem)."""
        with self._lock:
            return Counter(
                (x.status, x.problem) for a in self.agents for x in a.answers if where(x)
            )

    def answered(self, problem: str) -> dict[str, int]:
        """Runtime ID -> how many answers of this problem type it got (only those that did)."""
        with self._lock:
            found = {
                a.runtime.runtime_id: sum(1 for x in a.answers if x.problem == problem)
                for a in self.agents
            }
        return {rid: n for rid, n in found.items() if n}

    def answers_between(self, start: float, end: float) -> Counter[int]:
        """Statuses of the answers that came within [start, end] (monotonic)."""
        with self._lock:
            return Counter(x.status for a in self.agents for x in a.answers if start <= x.at <= end)

    def connected_before(self, moment: float) -> int:
        with self._lock:
            return sum(
                1 for a in self.agents if a.connected_at is not None and a.connected_at < moment
            )


# --- the judge --------------------------------------------------------------------------------


def held_in_director(real_compass: RealCompass, fleet: Fleet) -> dict[str, list[str]]:
    """Runtime ID -> the IDs of the runtimes Director holds with its label, for the fleet."""
    ours = {a.runtime.runtime_id for a in fleet.agents}
    held: dict[str, list[str]] = {rid: [] for rid in ours}
    for registered in real_compass.runtimes(label_key=RUNTIME_ID_LABEL):
        label = registered["labels"].get(RUNTIME_ID_LABEL)
        if label in ours:
            held[label].append(registered["id"])
    return held


def registered_more_than_once(real_compass: RealCompass, fleet: Fleet) -> list[str]:
    """What Director's database says against the fleet: runtimes held twice or not at all, and
    tokens handed out for another runtime than the one Director holds."""
    held = held_in_director(real_compass, fleet)
    found = []
    twice = {rid: ids for rid, ids in held.items() if len(ids) > 1}
    if twice:
        found.append(
            f"{len(twice)} of {len(held)} runtimes are registered more than once in Director: "
            f"{dict(list(twice.items())[:5])}"
        )
    missing = sorted(rid for rid, ids in held.items() if not ids)
    if missing:
        found.append(f"{len(missing)} runtimes are not registered in Director: {missing[:5]}")
    wrong = {
        a.runtime.runtime_id: (a.compass_runtime_id, held[a.runtime.runtime_id])
        for a in fleet.agents
        if a.compass_runtime_id is not None and [a.compass_runtime_id] != held[a.runtime.runtime_id]
    }
    if wrong:
        found.append(f"{len(wrong)} runtimes got a token of another runtime: {wrong}")
    return found


def refused(fleet: Fleet) -> list[str]:
    answered = fleet.answered(REJECTED)
    if not answered:
        return []
    return [
        f"{len(answered)} of {len(fleet.agents)} runtimes were answered {REJECTED} "
        f"({sum(answered.values())} answers)"
    ]


def not_told_to_come_back(fleet: Fleet) -> list[str]:
    """Answers other than a token that did not say when to come back (429 or 503 with
    Retry-After): Compass failing only delays a connection, it never fails it. A request the
    fleet gave up on (its own timeout on a machine loaded by other work) is no answer of the
    broker's: the agent asks again, as the fleet does, and the other checks still hold."""
    other = fleet.answers(
        lambda x: (
            x.status not in (201, TRANSPORT_ERROR)
            and not (x.status in (429, 503) and x.retry_after is not None)
        )
    )
    if not other:
        return []
    return [
        f"{sum(other.values())} answers were neither a token nor 429/503 with Retry-After: "
        f"{dict(other)}"
    ]


def not_connected(fleet: Fleet, *, within: float, after: str) -> list[str]:
    waiting = fleet.waiting()
    if not waiting:
        return []
    return [
        f"{len(waiting)} of {len(fleet.agents)} runtimes had no token {within:.0f} s after {after}"
    ]


def assert_no_failures(fleet: Fleet, *failures: list[str]) -> None:
    """One assertion for all the scenario's checks, so a failure names every one that failed."""
    found = [line for group in failures for line in group]
    assert not found, "\n".join(
        [*found, f"every answer (status, problem type): {dict(fleet.answers())}"]
    )


# --- the scenarios ----------------------------------------------------------------------------


SeedFleet = Callable[[int], list[Runtime]]


@pytest.fixture
def fleet_of(
    real_compass: RealCompass, control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster
) -> SeedFleet:
    """n runtimes of this test's own: Kymas in its KCP namespace, tenants Director knows."""

    def make(n: int) -> list[Runtime]:
        return seed_fleet(real_compass, control_plane, kcp_ns, runtime_a, n)

    return make


def test_postgres_stopped_20s_mid_cold_start_of_100_runtimes(
    real_brokers: BrokerFactory, real_compass: RealCompass, fleet_of: SeedFleet
) -> None:
    n = 100
    runtimes = fleet_of(n)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    with Fleet(broker, runtimes) as fleet:
        wait_for(
            lambda: fleet.connected() >= n // 4,
            timeout=60,
            interval=0.02,
            what=f"a quarter of {n} runtimes connected",
        )
        stopped_at = time.monotonic()
        with real_compass.database_stopped():
            time.sleep(20)  # the outage's length
        back_at = time.monotonic()
        fleet.wait_all(timeout=30)
    # The outage hit a cold start still under way, and was felt.
    assert fleet.connected_before(stopped_at) < n, "the cold start ended before the outage"
    during = fleet.answers_between(stopped_at + 1, back_at)
    assert sum(count for status, count in during.items() if status != 201), (
        f"no runtime was answered anything but 201 while PostgreSQL was stopped: {during}"
    )
    assert_no_failures(
        fleet,
        not_connected(fleet, within=30, after="PostgreSQL was back"),
        refused(fleet),
        not_told_to_come_back(fleet),
        registered_more_than_once(real_compass, fleet),
    )


def test_token_endpoint_refusing_the_credentials_for_30s(
    real_brokers: BrokerFactory, real_compass: RealCompass, fleet_of: SeedFleet
) -> None:
    n = 50
    canary, *runtimes = fleet_of(n + 1)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    # The broker holds an access token when the refusal begins: it is revoked too.
    first = broker.request_token(canary.runtime_id, canary.token())
    assert first.status_code == 201, first.text
    real_compass.refuse_credentials()
    try:
        refused_at = time.monotonic()
        with Fleet(broker, runtimes) as fleet:
            time.sleep(30)  # the refusal's length; the fleet asks meanwhile
            connected_while_refused = fleet.connected()
            real_compass.accept_credentials()
            fleet.wait_all(timeout=30)
    finally:
        real_compass.accept_credentials()
    assert connected_while_refused == 0, "runtimes connected while the credentials were refused"
    assert sum(fleet.answers_between(refused_at, refused_at + 30).values()) >= n
    assert_no_failures(
        fleet,
        not_connected(fleet, within=30, after="the credentials were accepted again"),
        refused(fleet),
        not_told_to_come_back(fleet),
        registered_more_than_once(real_compass, fleet),
    )


@pytest.mark.parametrize("run", [1, 2, 3])
def test_sessions_cut_every_half_second_during_a_cold_start_of_200_runtimes(
    real_brokers: BrokerFactory, real_compass: RealCompass, fleet_of: SeedFleet, run: int
) -> None:
    """One run of three in a row the issue asks for: each with fresh tenants and runtimes."""
    n = 200
    runtimes = fleet_of(n)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    with Fleet(broker, runtimes) as fleet:
        wait_for(
            lambda: fleet.connected() >= n // 4,
            timeout=60,
            interval=0.02,
            what=f"a quarter of {n} runtimes connected",
        )
        cutter = real_compass.cut_sessions(every=0.5, for_seconds=20)
        try:
            cutting_since = time.monotonic()
            fleet.wait_all(timeout=20 + 30)
        finally:
            cutter.stop()
    assert fleet.connected_before(cutting_since) < n, "the cold start ended before the cuts"
    assert cutter.terminated > 0, "no session of Director's was cut"
    assert_no_failures(
        fleet,
        not_connected(fleet, within=50, after="the cutting began"),
        refused(fleet),
        not_told_to_come_back(fleet),
        registered_more_than_once(real_compass, fleet),
    )
