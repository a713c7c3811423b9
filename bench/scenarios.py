"""The four scenarios: cold start, Director outage, steady state, agent footprint.

Holds for every fleet scenario: a fresh simulator, broker and KCP namespace (`bench.stack`);
all N agents ask at once; Director calls are read from the simulator's own request log (what
reached Director, not what the broker believes it sent); registrations are counted in the
simulator's store and mappings in KCP, so duplicates cannot hide. Every loop is bounded by a
deadline; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bench import stats
from bench.fleet import Fleet, FleetResult
from bench.keys import RuntimeKey, sign_token
from bench.procs import python_child, sample
from bench.progress import Progress
from bench.results import (
    ColdStartResult,
    DirectorCounts,
    FootprintResult,
    Integrity,
    LatencyFigures,
    OutageResult,
    SteadyResult,
)
from bench.stack import (
    Broker,
    DirectorCall,
    Kcp,
    Simulator,
    kyma_object,
    run_workdir,
    start_broker,
    start_simulator,
    unique_namespace,
)

PROBE_WINDOW = 5.0  # the target: at most one Director call per 5 s while it is down
RUNTIME_ID_LABEL = "kyma_runtime_id"  # the broker's default BROKER_RUNTIME_ID_LABEL


@dataclass(frozen=True)
class BenchConfig:
    sizes: tuple[int, ...]
    capacity: int
    latency: float
    outage_seconds: float
    down_mode: str
    steady_runtimes: int
    steady_callers: int
    idle_seconds: float
    max_run_seconds: float
    workdir: Path
    broker_env: dict[str, str] = field(default_factory=dict)
    profile_broker: bool = False

    def deadline(self, n: int, extra: float = 0.0) -> float:
        """How long one fleet run may take: generous against the bound, capped."""
        bound = stats.capacity_bound(n, latency=self.latency, capacity=self.capacity)
        return min(self.max_run_seconds, max(300.0, 10 * bound) + extra)


@dataclass
class Run:
    namespace: str
    keys: Sequence[RuntimeKey]
    sim: Simulator
    broker: Broker
    workdir: Path

    @property
    def runtime_ids(self) -> list[str]:
        return [k.runtime_id for k in self.keys]


class Bench:
    def __init__(
        self,
        config: BenchConfig,
        *,
        kcp: Kcp,
        keys: Sequence[RuntimeKey],
        tokens: dict[str, str],
        jwks_template: str,
        progress: Progress,
    ) -> None:
        self.config = config
        self.kcp = kcp
        self.keys = keys
        self.tokens = tokens
        self.jwks_template = jwks_template
        self.progress = progress

    # -- shared plumbing ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stack(
        self, name: str, n: int, *, capacity: int | None, latency: float
    ) -> AsyncIterator[Run]:
        cfg = self.config
        workdir = run_workdir(cfg.workdir, f"{name}-{n}")
        namespace = unique_namespace(f"bench-{name}")
        keys = self.keys[:n]
        self.progress.say(f"{name} N={n}: seeding {n} Kyma CRs in KCP namespace {namespace}")
        await self.kcp.create_namespace(namespace)
        await self.kcp.seed_kymas(namespace, keys)
        sim = await asyncio.to_thread(start_simulator, workdir, capacity=capacity, latency=latency)
        try:
            broker = await asyncio.to_thread(
                start_broker,
                workdir,
                kcp=self.kcp,
                namespace=namespace,
                sim=sim,
                jwks_issuer_template=self.jwks_template,
                max_concurrency=cfg.capacity,
                overrides=cfg.broker_env,
                profile=cfg.profile_broker,
            )
            try:
                yield Run(namespace=namespace, keys=keys, sim=sim, broker=broker, workdir=workdir)
            finally:
                code = broker.child.stop()
                if code != 0:
                    self.progress.say(f"broker exited with {code}; log: {broker.child.log_path}")
        finally:
            sim.child.stop()

    async def _monitor(
        self, run: Run, result: FleetResult, label: str, stop: asyncio.Event
    ) -> None:
        n = len(run.keys)
        async with httpx.AsyncClient(timeout=30) as http:
            while not stop.is_set():
                try:
                    await run.sim.poll_calls(http)
                except httpx.HTTPError as exc:  # the simulator is busy: read it next time
                    self.progress.say(f"{label}: reading the simulator failed ({exc!r})")

                def line() -> str:
                    top = ", ".join(f"{k}: {v}" for k, v in result.attempts.most_common(3))
                    return (
                        f"{label}: {result.connected}/{n} connected, "
                        f"{len(run.sim.director_calls)} Director calls; attempts {top}"
                    )

                self.progress.tick(line)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            await run.sim.poll_calls(http)

    async def _fleet(
        self, run: Run, label: str, *, deadline: float, result: FleetResult | None = None
    ) -> FleetResult:
        result = result or FleetResult(started_at=time.time())
        stop = asyncio.Event()
        monitor = asyncio.create_task(self._monitor(run, result, label, stop))
        try:
            fleet = Fleet(broker_url=run.broker.url, tokens=self.tokens)
            await fleet.run(run.runtime_ids, deadline_seconds=deadline, result=result)
        finally:
            stop.set()
            await monitor
        self.progress.say(
            f"{label}: {result.connected}/{len(run.keys)} connected in "
            f"{result.finished_at - result.started_at:.1f}s"
            + (" (deadline reached)" if result.timed_out else "")
        )
        return result

    async def _director_counts(self, run: Run, calls: Sequence[DirectorCall]) -> DirectorCounts:
        async with httpx.AsyncClient(timeout=30) as http:
            concurrency = await run.sim.get(http, "concurrency")
        return DirectorCounts(
            by_operation=dict(Counter(c.operation for c in calls)),
            peak_in_flight=int(concurrency["peak_in_flight"]),
            peak_active=int(concurrency["peak_active"]),
        )

    async def _integrity(self, run: Run) -> Integrity:
        async with httpx.AsyncClient(timeout=60) as http:
            runtimes: list[dict[str, Any]] = await run.sim.get(http, "runtimes")
        ids = [label_value(r.get("labels") or {}, RUNTIME_ID_LABEL) for r in runtimes]
        ours = [i for i in ids if i]
        mappings = await self.kcp.mappings(run.namespace)
        recorded = sum(
            1
            for m in mappings
            if ((m.get("metadata") or {}).get("labels") or {}).get(
                "kyma-project.io/compass-runtime-id"
            )
        )
        return Integrity(
            registrations=len(ours),
            distinct_runtimes=len(set(ours)),
            duplicates=stats.duplicate_registrations(ours),
            mappings_recorded=recorded,
        )

    # -- 1. cold start ------------------------------------------------------------------

    async def cold_start(self, n: int) -> ColdStartResult:
        cfg = self.config
        async with self.stack("cold", n, capacity=cfg.capacity, latency=cfg.latency) as run:
            cpu_before = sample(run.broker.pid).cpu_seconds
            result = await self._fleet(run, f"cold start N={n}", deadline=cfg.deadline(n))
            cpu = sample(run.broker.pid).cpu_seconds - cpu_before
            director = await self._director_counts(run, run.sim.director_calls)
            integrity = await self._integrity(run)
        return ColdStartResult(
            n=n,
            capacity=cfg.capacity,
            latency=cfg.latency,
            connected=result.connected,
            seconds=stats.completion_time(
                list(result.connected_at.values()), since=result.started_at, expected=n
            ),
            bound=stats.capacity_bound(n, latency=cfg.latency, capacity=cfg.capacity),
            director=director,
            integrity=integrity,
            attempts=dict(result.attempts),
            broker_cpu_seconds=cpu,
            timed_out=result.timed_out,
        )

    # -- 2. outage ----------------------------------------------------------------------

    async def outage(self, n: int) -> OutageResult:
        cfg = self.config
        async with self.stack("outage", n, capacity=cfg.capacity, latency=cfg.latency) as run:
            async with httpx.AsyncClient(timeout=30) as http:
                await run.sim.patch_faults(http, down=cfg.down_mode)
                down_at = time.time()
                cpu_before = sample(run.broker.pid).cpu_seconds
                result = FleetResult(started_at=down_at)
                fleet = asyncio.create_task(
                    self._fleet(
                        run,
                        f"outage N={n}",
                        deadline=cfg.deadline(n, extra=cfg.outage_seconds),
                        result=result,
                    )
                )
                await asyncio.wait({fleet}, timeout=cfg.outage_seconds)
                await run.sim.patch_faults(http, down=None)
                up_at = time.time()
                self.progress.say(f"outage N={n}: Director is back after {up_at - down_at:.0f}s")
            await fleet
            cpu = sample(run.broker.pid).cpu_seconds - cpu_before
            calls = run.sim.calls  # Director and OAuth: both count as calls to Compass
            during = [c.at for c in calls if down_at <= c.at < up_at]
            oauth_during = sum(
                1 for c in calls if c.endpoint == "oauth" and down_at <= c.at < up_at
            )
            after = [c for c in run.sim.director_calls if c.at >= up_at]
            director_after = await self._director_counts(run, after)
            integrity = await self._integrity(run)
        connected = list(result.connected_at.values())
        # The breaker needs a few failures to open; on a busy broker they can take more than
        # 5 s. The opening burst ends at the first 5 s of silence, probes are what follows.
        opening, probes = stats.split_at_first_gap(during, PROBE_WINDOW)
        return OutageResult(
            n=n,
            capacity=cfg.capacity,
            latency=cfg.latency,
            outage_seconds=up_at - down_at,
            connected=result.connected,
            connected_during_outage=sum(1 for t in connected if t < up_at),
            recovery_seconds=stats.completion_time(connected, since=up_at, expected=n),
            first_connect_after_return=(
                min(t for t in connected if t >= up_at) - up_at
                if any(t >= up_at for t in connected)
                else None
            ),
            bound=stats.capacity_bound(n, latency=cfg.latency, capacity=cfg.capacity),
            calls_during_outage=len(during),
            oauth_calls_during_outage=oauth_during,
            calls_first_window=len(opening),
            max_calls_per_window_after=stats.max_in_sliding_window(probes, PROBE_WINDOW),
            director_after_return=director_after,
            integrity=integrity,
            attempts=dict(result.attempts),
            broker_cpu_seconds=cpu,
            timed_out=result.timed_out,
            connect_times=sorted(t - down_at for t in connected),
            down_at=0.0,
            up_at=up_at - down_at,
            ended_at=result.finished_at - down_at,
        )

    # -- 3. steady state ----------------------------------------------------------------

    async def steady(self) -> SteadyResult:
        """Registered runtimes ask again; Director answers at once (latency 0, capacity C) so
        the figures are the broker's own, plus the simulator's small service time."""
        cfg = self.config
        m = cfg.steady_runtimes
        async with self.stack("steady", m, capacity=cfg.capacity, latency=0.0) as run:
            # Registered beforehand in batches: all at once is what the cold start measures.
            ids: list[str] = []
            batch = 50
            for first in range(0, m, batch):
                part = Run(
                    run.namespace, run.keys[first : first + batch], run.sim, run.broker, run.workdir
                )
                pre = await self._fleet(
                    part, f"steady: registering {first + batch}/{m}", deadline=cfg.deadline(batch)
                )
                ids += list(pre.connected_at)
            # Each registration used one token of the runtime's rate-limit bucket (burst 5):
            # one sequential round on a few runtimes, then three rounds over all of them.
            single = await self._load(run, ids[:50], callers=1, expect=201, label="1 caller")
            since = len(run.sim.director_calls)
            issued = await self._load(
                run, ids * 3, callers=cfg.steady_callers, expect=201, label="200 callers"
            )
            async with httpx.AsyncClient(timeout=30) as http:
                await run.sim.poll_calls(http)
                ott = [
                    c.duration * 1000
                    for c in run.sim.director_calls[since:]
                    if c.operation == "requestOneTimeTokenForRuntime"
                ]
                # Concurrent requests for one runtime share one token (single-flight): CPU is
                # divided by the tokens Director actually issued in the phase.
                issued = replace(issued, counted=len(ott))
                await run.sim.patch_faults(http, down="503")
            # Open the breaker (threshold consecutive failures), then measure the 503s.
            await self._load(run, ids[:20], callers=1, expect=503, label="opening the breaker")
            rejected = await self._load(
                run, ids * 3, callers=cfg.steady_callers, expect=503, label="503s"
            )
        return SteadyResult(
            runtimes=len(ids),
            callers=cfg.steady_callers,
            issued=issued,
            single=single,
            rejected=rejected,
            director_p50_ms=stats.percentile(ott, 50) if ott else 0.0,
            director_p99_ms=stats.percentile(ott, 99) if ott else 0.0,
        )

    async def _load(
        self, run: Run, jobs: Sequence[str], *, callers: int, expect: int, label: str
    ) -> LatencyFigures:
        """`callers` concurrent callers work through `jobs` (one request per runtime ID)."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        latencies: list[float] = []
        statuses: Counter[str] = Counter()
        limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
        async with httpx.AsyncClient(base_url=run.broker.url, timeout=60, limits=limits) as http:

            async def caller() -> None:
                while True:
                    try:
                        runtime_id = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    headers = {"Authorization": f"Bearer {self.tokens[runtime_id]}"}
                    started = time.perf_counter()
                    try:
                        response = await http.post(
                            f"/v1/runtimes/{runtime_id}/token", headers=headers
                        )
                        status = str(response.status_code)
                    except httpx.TransportError:  # counted, as an agent would see it
                        status = "transport error"
                    latencies.append(time.perf_counter() - started)
                    statuses[status] += 1

            cpu_before = sample(run.broker.pid).cpu_seconds
            started = time.perf_counter()
            await asyncio.wait_for(
                asyncio.gather(*(caller() for _ in range(callers))),
                timeout=self.config.max_run_seconds,
            )
            seconds = time.perf_counter() - started
            cpu = sample(run.broker.pid).cpu_seconds - cpu_before
        ms = [x * 1000 for x in latencies]
        figures = LatencyFigures(
            requests=len(latencies),
            statuses=dict(statuses),
            p50_ms=stats.percentile(ms, 50),
            p99_ms=stats.percentile(ms, 99),
            max_ms=max(ms),
            seconds=seconds,
            broker_cpu_seconds=cpu,
            counted=statuses[str(expect)],
        )
        self.progress.say(
            f"steady {label}: {figures.requests} requests {dict(statuses)}, "
            f"p50 {figures.p50_ms:.1f} ms, p99 {figures.p99_ms:.1f} ms"
        )
        return figures

    # -- 4. agent footprint -------------------------------------------------------------

    async def footprint(self, runtime_cluster: Any) -> FootprintResult:
        """The real agent (`python -m agent`) against a real runtime API server, then idle."""
        cfg = self.config
        key = self.keys[0]
        async with self.stack("footprint", 1, capacity=cfg.capacity, latency=cfg.latency) as run:
            await asyncio.to_thread(prepare_runtime, runtime_cluster, key)
            token_file = run.workdir / "agent-token"
            token_file.write_text(
                sign_token(key, issuer=self.jwks_template.format(runtime_id=key.runtime_id))
            )
            token_file.chmod(0o600)
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
            env.update(
                {
                    "AGENT_BROKER_URL": run.broker.url,
                    "AGENT_KUBECONFIG": str(runtime_cluster.kubeconfig_path),
                    "AGENT_SA_TOKEN_FILE": str(token_file),
                    "AGENT_HEALTH_ADDRESS": "127.0.0.1:0",
                    "AGENT_IDENTITY": "bench-agent",
                }
            )
            agent = python_child("compass-agent", "agent", env=env, log_path=run.workdir / "a.log")
            try:
                started = time.monotonic()
                await asyncio.to_thread(wait_for_secret, runtime_cluster, agent, 120.0)
                connect_seconds = time.monotonic() - started
                await asyncio.to_thread(report_connected, runtime_cluster)
                await asyncio.sleep(5)  # let it see the CompassConnection and settle
                self.progress.say(f"footprint: agent connected, idle for {cfg.idle_seconds:.0f}s")
                before = sample(agent.pid)
                idle_started = time.monotonic()
                await asyncio.sleep(cfg.idle_seconds)
                after = sample(agent.pid)
                idle = time.monotonic() - idle_started
                if not agent.alive():
                    raise RuntimeError(f"the agent exited:\n{agent.tail()}")
            finally:
                agent.stop()
            async with httpx.AsyncClient(timeout=30) as http:
                await run.sim.poll_calls(http)
            pulls = sum(1 for c in run.sim.calls if c.operation == "requestOneTimeTokenForRuntime")
        return FootprintResult(
            idle_seconds=idle,
            cpu_seconds=after.cpu_seconds - before.cpu_seconds,
            peak_rss_bytes=after.peak_rss_bytes,
            rss_bytes_end=after.rss_bytes,
            connect_seconds=connect_seconds,
            pulls=pulls,
        )


def label_value(labels: dict[str, Any], key: str) -> str | None:
    """Director label values are JSON: a string, or a list of strings for some labels."""
    value = labels.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else str(value)


AGENT_NS = "kyma-system"


def prepare_runtime(cluster: Any, key: RuntimeKey) -> None:
    """The runtime side as KLM leaves it: Kyma `kyma-system/default` with the module on."""
    cluster.create_namespace(AGENT_NS)
    body = kyma_object(AGENT_NS, 0, key)
    body["metadata"]["name"] = "default"
    labels = body["metadata"]["labels"]
    body["metadata"]["labels"] = {
        k: v
        for k, v in labels.items()
        if k
        in (
            "kyma-project.io/runtime-id",
            "kyma-project.io/global-account-id",
            "kyma-project.io/subaccount-id",
        )
    }
    with contextlib.suppress(ApiException):
        cluster.custom.delete_namespaced_custom_object(
            "operator.kyma-project.io", "v1beta2", AGENT_NS, "kymas", "default"
        )
    cluster.custom.create_namespaced_custom_object(
        "operator.kyma-project.io", "v1beta2", AGENT_NS, "kymas", body
    )


def wait_for_secret(cluster: Any, agent: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    core: k8s.CoreV1Api = cluster.core
    while time.monotonic() < deadline:
        if not agent.alive():
            raise RuntimeError(f"the agent exited:\n{agent.tail()}")
        try:
            core.read_namespaced_secret("compass-agent-configuration", AGENT_NS)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        time.sleep(0.2)
    raise RuntimeError(f"the agent wrote no token secret within {timeout:.0f}s:\n{agent.tail()}")


def report_connected(cluster: Any) -> None:
    """What compass-runtime-agent does once it used the token: CompassConnection Connected."""
    group, version = "compass.kyma-project.io", "v1alpha1"
    plural, name = "compassconnections", "compass-connection"
    custom: k8s.CustomObjectsApi = cluster.custom
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(
            group,
            version,
            plural,
            {
                "apiVersion": f"{group}/{version}",
                "kind": "CompassConnection",
                "metadata": {"name": name},
                "spec": {},
            },
        )
    custom.patch_cluster_custom_object_status(
        group,
        version,
        plural,
        name,
        {"status": {"connectionState": "Connected", "connectionStatus": {}}},
    )
