"""The scenarios: fleet runs (cold start, Director outage; per identity mode and replica count),
steady state, agent footprint.

Holds for every fleet run: a fresh simulator, fresh broker(s) and a KCP namespace of its own
(`bench.stack`); all N agents ask at once from their own processes (`bench.fleet`); Director
calls are read from the simulator's own request log (what reached Director, not what the
broker believes it sent); registrations are counted in the simulator's store and mappings in
KCP, so duplicates cannot hide; KCP requests are the API server's own count; CPU and memory
come from /proc. Nothing but the broker talks to KCP between the two readings of a phase.
Every loop is bounded by a deadline; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import plan as planning
from bench import slow, stats
from bench.fleet import Agent, FleetProcesses, FleetResult, assign_brokers
from bench.footprint import measure_footprint
from bench.keys import AUDIENCE, RuntimeKey, sign_token
from bench.plan import RunSpec
from bench.procs import CpuSnapshot, cpu_by_role, sample
from bench.profiling import (
    ProfileSummary,
    PySpyRecorder,
    py_spy_problem,
    summarise_collapsed,
    summarise_cprofile,
)
from bench.progress import Progress
from bench.prometheus import KcpRequests, delta, unlabelled_samples
from bench.results import (
    CpuUse,
    DirectorCounts,
    FleetRunResult,
    FootprintResult,
    Integrity,
    LatencyFigures,
    Plan,
    ReportsResult,
    SteadyResult,
)
from bench.stack import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    ApiServer,
    Broker,
    DirectorCall,
    Simulator,
    run_workdir,
    start_brokers,
    start_simulator,
    unique_namespace,
)
from control_plane_broker.registration import state as registration_state
from control_plane_broker.settings import Settings
from kubeapi import KubeError

PROBE_WINDOW = 5.0  # the target: at most one call to Compass per 5 s while it is down
RUNTIME_ID_LABEL = "kyma_runtime_id"  # the broker's default BROKER_RUNTIME_ID_LABEL
BREAKER_GAUGE = "broker_circuit_breaker_open"
BREAKER_OPENED_GAUGE = "broker_circuit_breaker_opened_timestamp_seconds"
TOKEN = "requestOneTimeTokenForRuntime"
ADMISSION_SAMPLE_SECONDS = 1.0
ADMISSION_GAUGES = (
    "broker_director_calls_in_flight",
    "broker_director_calls_waiting",
    "broker_director_call_seconds_estimate",
    "broker_director_booked_ahead_seconds",
    "broker_director_tickets",
    "broker_director_calendar_shift_seconds",
    "broker_director_slot_timeouts_total",
    "broker_director_late_calls_total",
    "broker_event_loop_lag_seconds",
    "broker_first_contacts_waiting",
    "broker_deferred_writes_pending",
)
REGISTER_BATCH = 50  # steady state registers its runtimes in batches (not a cold start)
TOKEN_SLACK_SECONDS = 3600  # tokens stay valid this long after a run's deadline
REPORT_BATCH = 500  # the reports scenario registers its runtimes in batches of this size
REPORT_SENDERS = 50  # concurrent senders of connection reports
# Used only if the broker's settings lack BROKER_REPORT_REFRESH_SECONDS: a report that changes
# nothing is written only when the recorded one is older than this.
DEFAULT_REPORT_REFRESH_SECONDS = 3600.0


@dataclass(frozen=True)
class BenchConfig:
    plan: Plan
    down_mode: str
    idle_seconds: float
    workdir: Path
    broker_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RuntimeClusters:
    """The runtime API servers of `tokenreview` runs, shared by the fleet's kubeconfigs."""

    servers: list[ApiServer]
    kubeconfigs: list[str]  # admin kubeconfig text of each (what KEB's Secret holds)


@dataclass
class Run:
    spec: RunSpec
    namespace: str
    keys: Sequence[RuntimeKey]
    sim: Simulator
    brokers: list[Broker]
    workdir: Path
    breaker_opened_at: float | None = None  # wall clock, first seen open on any replica

    @property
    def runtime_ids(self) -> list[str]:
        return [k.runtime_id for k in self.keys]


@dataclass
class Measured:
    """What one fleet phase measured besides the fleet's own result."""

    fleet: FleetResult
    kcp: KcpRequests
    cpu: CpuUse
    broker_cpu_seconds: float
    broker_rss_peak_bytes: int
    runtime_api: KcpRequests | None = None


class Bench:
    def __init__(
        self,
        config: BenchConfig,
        *,
        kcp: ApiServer,
        keys: Sequence[RuntimeKey],
        jwks_template: str,
        progress: Progress,
        runtime_clusters: RuntimeClusters | None = None,
    ) -> None:
        self.config = config
        self.plan = config.plan
        self.kcp = kcp
        self.keys = keys
        self.jwks_template = jwks_template
        self.progress = progress
        self.runtime_clusters = runtime_clusters
        self.profile: ProfileSummary | None = None
        self.child_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    # -- shared plumbing ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stack(
        self,
        spec: RunSpec,
        *,
        capacity: int | None,
        cprofile: bool = False,
        target: Simulator | None = None,
        broker_env: Mapping[str, str] | None = None,
        sim_latency: float | None = None,
    ) -> AsyncIterator[Run]:
        """The run's system under test. `target`: a Director started by the caller (the real
        one, `bench.real`) instead of a fresh simulator; the caller stops it. `broker_env`:
        settings of this run's brokers on top of the bench's own. `sim_latency`: the fresh
        simulator's latency, when not the run's (`spec.latency`)."""
        workdir = run_workdir(self.config.workdir, spec.label.replace(" ", "_").replace(",", ""))
        namespace = unique_namespace(f"bench-{spec.scenario}")
        keys = self.keys[: spec.n]
        self.progress.say(f"{spec.label}: KCP namespace {namespace}")
        await self.kcp.create_namespace(namespace)
        if spec.identity_mode == "tokenreview":
            clusters = self._clusters()
            await self.kcp.seed_kubeconfigs(namespace, keys, clusters.kubeconfigs)
        latency = spec.latency if sim_latency is None else sim_latency
        sim = target or await asyncio.to_thread(
            start_simulator, workdir, capacity=capacity, latency=latency
        )
        try:
            brokers = await asyncio.to_thread(
                start_brokers,
                workdir,
                replicas=spec.replicas,
                kcp=self.kcp,
                namespace=namespace,
                sim=sim,
                identity_mode=spec.identity_mode,
                jwks_issuer_template=self.jwks_template,
                max_concurrency=self.plan.broker_concurrency,
                overrides={**self.config.broker_env, **(broker_env or {})},
                cprofile_first=cprofile,
            )
            try:
                # The Kymas arrive while the brokers run, as new runtimes do in a landscape: a
                # Kyma created after a broker's mapping watch listed is certainly new to it and
                # registers without a look-up (a Kyma older than the broker is looked up first).
                await asyncio.sleep(CERTAINLY_NEW_AFTER)
                self.progress.say(f"{spec.label}: seeding {spec.n} Kyma CRs")
                await self.kcp.seed_kymas(namespace, keys)
                await asyncio.to_thread(wait_kymas_cached, brokers, spec.n)
                yield Run(
                    spec=spec,
                    namespace=namespace,
                    keys=keys,
                    sim=sim,
                    brokers=brokers,
                    workdir=workdir,
                )
            finally:
                for broker in brokers:
                    code = broker.child.stop()
                    if code not in (0, None):
                        self.progress.say(
                            f"broker exited with {code}; log: {broker.child.log_path}"
                        )
        finally:
            if target is None:
                sim.child.stop()
            self.progress.say(f"{spec.label}: clearing KCP namespace {namespace}")
            try:
                await self.kcp.clear_namespace(namespace)
            except KubeError as exc:  # the run's own outcome matters more than the tidying
                self.progress.say(f"{spec.label}: could not clear {namespace}: {exc}")

    def _clusters(self) -> RuntimeClusters:
        if self.runtime_clusters is None:
            raise RuntimeError("tokenreview runs need runtime API servers")
        return self.runtime_clusters

    async def tokens_for(self, spec: RunSpec, keys: Sequence[RuntimeKey]) -> dict[str, str]:
        """The agents' bearer tokens, made before the run: signed by each runtime's key (jwks),
        or issued by TokenRequest on the runtime's API server for the broker's audience
        (tokenreview, runtime i on server i mod count); valid beyond the run's deadline."""
        seconds = int(planning.deadline(self.plan, spec)) + TOKEN_SLACK_SECONDS
        if spec.identity_mode == "jwks":
            return {
                k.runtime_id: sign_token(
                    k, issuer=self.jwks_template.format(runtime_id=k.runtime_id), lifetime=seconds
                )
                for k in keys
            }
        servers = self._clusters().servers
        per_server = [
            await server.service_account_tokens(
                AGENT_NAMESPACE,
                AGENT_SERVICE_ACCOUNT,
                count=len(keys[i :: len(servers)]),
                audience=AUDIENCE,
                seconds=seconds,
            )
            for i, server in enumerate(servers)
        ]
        return {
            k.runtime_id: per_server[i % len(servers)][i // len(servers)]
            for i, k in enumerate(keys)
        }

    async def _monitor(self, run: Run, result: FleetResult, stop: asyncio.Event) -> None:
        """Reads the simulator's log as it grows (it keeps only the last 10,000 records) and,
        while Director is down, when the broker's breaker opens; prints progress."""
        n = len(run.keys)
        watch_breaker = run.spec.scenario == "outage"
        next_admission_sample = 0.0
        async with httpx.AsyncClient(timeout=10) as http:
            while not stop.is_set():
                try:
                    await run.sim.poll_calls(http)
                except httpx.HTTPError as exc:  # the simulator is busy: read it next time
                    self.progress.say(f"{run.spec.label}: reading the simulator failed ({exc!r})")
                now = time.time()
                want_breaker = watch_breaker and run.breaker_opened_at is None
                want_sample = now >= next_admission_sample
                if want_sample:
                    next_admission_sample = now + ADMISSION_SAMPLE_SECONDS
                if want_breaker or want_sample:
                    # One scrape per broker feeds both readers: a broker busy with the herd
                    # answers each extra /metrics request between its runtimes' requests.
                    scrapes = await self._scrape_brokers(http, run)
                    if want_breaker:
                        run.breaker_opened_at = breaker_opened_at(scrapes.values(), time.time())
                    if want_sample:
                        self._sample_admission(run, scrapes)

                def line() -> str:
                    top = ", ".join(f"{k}: {v}" for k, v in result.attempts.most_common(3))
                    return (
                        f"{run.spec.label}: {result.connected}/{n} connected, "
                        f"{len(run.sim.director_calls)} Director calls; attempts {top}"
                    )

                self.progress.tick(line)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            await run.sim.poll_calls(http)

    @staticmethod
    async def _scrape_brokers(http: httpx.AsyncClient, run: Run) -> dict[int, dict[str, float]]:
        """Each broker's unlabelled samples by its index; a busy broker is left out (asked again
        at the next poll)."""
        scrapes: dict[int, dict[str, float]] = {}
        for index, broker in enumerate(run.brokers):
            try:
                response = await http.get(f"{broker.url}/metrics", timeout=2.0)
            except httpx.HTTPError:
                continue
            scrapes[index] = unlabelled_samples(response.text)
        return scrapes

    @staticmethod
    def _sample_admission(run: Run, scrapes: Mapping[int, Mapping[str, float]]) -> None:
        """Appends each broker's Director admission gauges to `admission-<i>.csv` in the run's
        work folder (kept with --keep-workdir): why Director idled, when a run was slow."""
        for index, samples in scrapes.items():
            path = run.workdir / f"admission-{index}.csv"
            with path.open("a") as out:
                if out.tell() == 0:
                    out.write(",".join(["unix_seconds", *ADMISSION_GAUGES]) + "\n")
                out.write(admission_row(samples, time.time()) + "\n")

    async def _fleet(
        self,
        run: Run,
        agents: Sequence[Agent],
        *,
        deadline: float,
        result: FleetResult | None = None,
        went: asyncio.Event | None = None,
    ) -> Measured:
        """Starts the fleet processes, takes the 'before' readings, says go, waits for the
        end, takes the 'after' readings (before anything else reads KCP)."""
        result = result or FleetResult(started_at=0.0)
        procs = FleetProcesses(
            brokers=[b.url for b in run.brokers],
            agents=agents,
            processes=self.plan.fleet_processes,
            workdir=run.workdir,
            env=self.child_env,
            deadline_seconds=deadline,
        )
        try:
            await procs.start()
        except BaseException:
            await procs.stop()
            raise
        runtime_servers = (
            self._clusters().servers if run.spec.identity_mode == "tokenreview" else []
        )
        runtime_before = [await server.request_counts() for server in runtime_servers]
        kcp_before = await self.kcp.request_counts()
        cpu_before = CpuSnapshot.take()
        stop = asyncio.Event()
        monitor = asyncio.create_task(self._monitor(run, result, stop))
        try:
            await procs.run(result, went=went)
        finally:
            stop.set()
            await monitor
        cpu_after = CpuSnapshot.take()
        kcp_after = await self.kcp.request_counts()
        runtime_api: dict[str, int] = {}
        for server, before in zip(runtime_servers, runtime_before, strict=True):
            for key, count in delta(before, await server.request_counts()).items():
                runtime_api[key] = runtime_api.get(key, 0) + count
        samples = [sample(b.pid) for b in run.brokers]
        broker_cpu = sum(
            cpu_after.by_pid.get(b.pid, ("", 0.0))[1] - cpu_before.by_pid.get(b.pid, ("", 0.0))[1]
            for b in run.brokers
        )
        self.progress.say(
            f"{run.spec.label}: {result.connected}/{len(agents)} connected in "
            f"{result.finished_at - result.started_at:.1f}s"
            + (" (deadline reached)" if result.timed_out else "")
        )
        return Measured(
            fleet=result,
            kcp=KcpRequests(delta(kcp_before, kcp_after)),
            cpu=CpuUse(
                by_role=cpu_by_role(cpu_before, cpu_after, extra={"fleet": result.cpu_seconds}),
                machine_busy=cpu_after.machine_busy - cpu_before.machine_busy,
                wall_seconds=cpu_after.at - cpu_before.at,
                cores=os.cpu_count() or 1,
            ),
            broker_cpu_seconds=broker_cpu,
            broker_rss_peak_bytes=max(s.peak_rss_bytes for s in samples),
            runtime_api=KcpRequests(runtime_api) if runtime_servers else None,
        )

    def agents(self, run: Run, tokens: dict[str, str]) -> list[Agent]:
        ids = run.runtime_ids
        return [
            Agent(runtime_id=rid, token=tokens[rid], broker=b)
            for rid, b in zip(ids, assign_brokers(ids, len(run.brokers)), strict=True)
        ]

    async def _director_counts(self, run: Run, calls: Sequence[DirectorCall]) -> DirectorCounts:
        async with httpx.AsyncClient(timeout=30) as http:
            concurrency = await run.sim.get(http, "concurrency")
        return DirectorCounts(
            by_operation=dict(Counter(c.operation for c in calls)),
            peak_in_flight=int(concurrency["peak_in_flight"]),
            peak_active=int(concurrency["peak_active"]),
            busy_seconds=sum(c.duration for c in calls if c.endpoint == "director"),
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

    # -- profiling ----------------------------------------------------------------------

    def _profiler_problem(self) -> str | None:
        """Checked on a process we own before the profiled run, so a fallback to cProfile can
        still be chosen before its broker starts."""
        return py_spy_problem(os.getpid())

    def _finish_profile(
        self, run: Run, recorder: PySpyRecorder | None, problem: str | None
    ) -> ProfileSummary:
        if recorder is not None:
            text = recorder.stop()
            samples, own, ours = summarise_collapsed(text)
            note = "" if samples else f"py-spy recorded no samples: {recorder.log_tail()}"
            return ProfileSummary(
                tool="py-spy",
                run=run.spec.label,
                samples=samples,
                top_own=own,
                top_broker=ours,
                note=note,
                file=str(recorder.output),
            )
        path = run.workdir / "broker.prof"  # written when the broker exited (stack's end)
        try:
            top = summarise_cprofile(path)
        except (OSError, TypeError, ValueError) as exc:
            top, problem = [], f"{problem}; cProfile wrote nothing readable ({exc!r})"
        return ProfileSummary(
            tool="cProfile",
            run=run.spec.label,
            samples=0,
            top_own=top,
            note=f"py-spy was not used: {problem}",
            file=str(path),
        )

    # -- cold start and outage ------------------------------------------------------------

    async def fleet_run(self, spec: RunSpec) -> FleetRunResult:
        plan = self.plan
        problem = self._profiler_problem() if spec.profile else None
        keys = self.keys[: spec.n]
        self.progress.say(f"{spec.label}: preparing {spec.n} tokens ({spec.identity_mode})")
        tokens = await self.tokens_for(spec, keys)
        deadline = planning.deadline(plan, spec)
        run_for_profile: Run | None = None
        recorder: PySpyRecorder | None = None
        async with self.stack(
            spec, capacity=plan.capacity, cprofile=spec.profile and problem is not None
        ) as run:
            if spec.profile and problem is None:
                recorder = PySpyRecorder(
                    run.brokers[0].pid, run.workdir / "broker.pyspy.txt", run.workdir / "py-spy.log"
                )
            run_for_profile = run
            try:
                if spec.scenario == "outage":
                    result = await self._outage(run, tokens, deadline)
                else:
                    result = await self._cold(run, tokens, deadline)
            finally:
                if recorder is not None:
                    self.profile = self._finish_profile(run, recorder, None)
        if spec.profile and recorder is None and run_for_profile is not None:
            self.profile = self._finish_profile(run_for_profile, None, problem)
        if spec.profile and self.profile is not None:
            result = FleetRunResult(**{**result.__dict__, "profiled": self.profile.tool})
        return result

    async def _result(
        self,
        run: Run,
        m: Measured,
        *,
        director_calls: Sequence[DirectorCall],
        deadline: float,
        **scenario_figures: Any,
    ) -> FleetRunResult:
        """What every fleet run reports: Director calls, integrity, costs; `scenario_figures`
        add the cold start's or the outage's own."""
        spec, fleet = run.spec, m.fleet
        return FleetRunResult(
            scenario=spec.scenario,
            n=spec.n,
            capacity=self.plan.capacity,
            latency=spec.latency,
            identity_mode=spec.identity_mode,
            replicas=spec.replicas,
            connected=fleet.connected,
            bound=stats.capacity_bound(spec.n, latency=spec.latency, capacity=self.plan.capacity),
            director=await self._director_counts(run, director_calls),
            integrity=await self._integrity(run),
            attempts=dict(fleet.attempts),
            broker_cpu_seconds=m.broker_cpu_seconds,
            broker_rss_peak_bytes=m.broker_rss_peak_bytes,
            kcp=m.kcp,
            cpu=m.cpu,
            timed_out=fleet.timed_out,
            deadline_seconds=deadline,
            connect_times=sorted(t - fleet.started_at for t in fleet.connected_at.values()),
            ended_at=fleet.finished_at - fleet.started_at,
            lost_log_records=run.sim.lost_records,
            runtime_api=m.runtime_api,
            **scenario_figures,
        )

    async def _cold(self, run: Run, tokens: dict[str, str], deadline: float) -> FleetRunResult:
        m = await self._fleet(run, self.agents(run, tokens), deadline=deadline)
        fleet = m.fleet
        return await self._result(
            run,
            m,
            director_calls=run.sim.director_calls,
            deadline=deadline,
            seconds=stats.completion_time(
                list(fleet.connected_at.values()), since=fleet.started_at, expected=run.spec.n
            ),
        )

    async def _outage(self, run: Run, tokens: dict[str, str], deadline: float) -> FleetRunResult:
        spec, plan = run.spec, self.plan
        async with httpx.AsyncClient(timeout=30) as http:
            await run.sim.patch_faults(http, down=self.config.down_mode)
            went = asyncio.Event()
            result = FleetResult(started_at=0.0)
            fleet = asyncio.create_task(
                self._fleet(
                    run, self.agents(run, tokens), deadline=deadline, result=result, went=went
                )
            )
            go = asyncio.create_task(went.wait())
            await asyncio.wait({fleet, go}, return_when=asyncio.FIRST_COMPLETED)
            go.cancel()
            if went.is_set() and not fleet.done():
                # Down from the moment the fleet starts asking, for T.
                remaining = result.started_at + plan.outage_seconds - time.time()
                await asyncio.wait({fleet}, timeout=max(0.0, remaining))
            await run.sim.patch_faults(http, down=None)
            up_at = time.time()
            self.progress.say(f"{spec.label}: Director is back")
            m = await fleet
        down_at = m.fleet.started_at
        calls = run.sim.calls  # Director and OAuth: both count as calls to Compass
        write_calls(run.workdir / "compass-calls.csv", calls, down_at=down_at, up_at=up_at)
        during = [c.at for c in calls if down_at <= c.at < up_at]
        oauth_during = sum(1 for c in calls if c.endpoint == "oauth" and down_at <= c.at < up_at)
        after = [c for c in run.sim.director_calls if c.at >= up_at]
        if run.breaker_opened_at is not None:
            burst, probes = stats.split_at(during, run.breaker_opened_at)
            rule = "calls before the moment the broker's breaker opened (its own timestamp gauge)"
            opened_after: float | None = run.breaker_opened_at - down_at
            windows_from = run.breaker_opened_at
        else:
            # No breaker gauge on this broker: the opening burst ends at the first 5 s pause.
            burst, probes = stats.split_at_first_gap(during, PROBE_WINDOW)
            rule = "no breaker gauge seen open: calls before the first 5 s without any"
            opened_after = None
            windows_from = probes[0] if probes else up_at
        connected = list(m.fleet.connected_at.values())
        return await self._result(
            run,
            m,
            director_calls=after,
            deadline=deadline,
            outage_seconds=up_at - down_at,
            recovery_seconds=stats.completion_time(connected, since=up_at, expected=spec.n),
            connected_during_outage=sum(1 for t in connected if t < up_at),
            first_connect_after_return=(
                min(t for t in connected if t >= up_at) - up_at
                if any(t >= up_at for t in connected)
                else None
            ),
            calls_during_outage=len(during),
            oauth_calls_during_outage=oauth_during,
            breaker_opened_after=opened_after,
            burst_rule=rule,
            opening_burst=len(burst),
            windows_after=(
                stats.window_counts(probes, start=windows_from, end=up_at, width=PROBE_WINDOW)
                if up_at > windows_from
                else []
            ),
            max_calls_per_window_after=stats.max_in_sliding_window(probes, PROBE_WINDOW),
            up_at=up_at - down_at,
        )

    # -- a slow Director (bench.slow) ------------------------------------------------------

    async def slow_director(
        self, *, n: int, latency: tuple[float, float], commit: str = "", note: str = ""
    ) -> slow.SlowRun:
        """N runtimes start cold against the simulator with every Director call taking
        `latency` (min, max) seconds and no limit on Director's own concurrency: the brokers'
        slots are the limit (`bench.slow`)."""
        low, high = latency
        spec = RunSpec("slow", n, (low + high) / 2)
        tokens = await self.tokens_for(spec, self.keys[:n])
        deadline = planning.deadline(self.plan, spec)
        load_before = os.getloadavg()[0]
        started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        # The fault is set once the brokers are up: their start-up calls (OAuth) stay fast, and
        # only Director's endpoint is slowed, as a slow Director behind a healthy gateway is.
        async with self.stack(spec, capacity=None, sim_latency=0.0) as run:
            async with httpx.AsyncClient(timeout=30) as http:
                await run.sim.patch_faults(
                    http,
                    latency={
                        "fixed_seconds": low,
                        "jitter_seconds": high - low,
                        "endpoints": ["director"],
                    },
                )
                m = await self._fleet(run, self.agents(run, tokens), deadline=deadline)
                scrapes = await self._scrape_brokers(http, run)
            integrity = await self._integrity(run)
        fleet = m.fleet
        calls = [c for c in run.sim.director_calls if c.at >= fleet.started_at]
        return slow.result(
            target="simulator",
            commit=commit,
            started=started,
            n=n,
            slots=self.plan.broker_concurrency,
            latency=latency,
            connected=fleet.connected,
            seconds=stats.completion_time(
                list(fleet.connected_at.values()), since=fleet.started_at, expected=n
            ),
            calls=slow.intervals((c.at, c.duration, c.operation) for c in calls),
            since=fleet.started_at,
            attempts=dict(fleet.attempts),
            gauges=[dict(v) for v in scrapes.values()],
            duplicates=integrity.duplicates,
            load=(load_before, os.getloadavg()[0]),
            note=note,
        )

    # -- steady state ---------------------------------------------------------------------

    async def _register(
        self, run: Run, tokens: dict[str, str], *, batch: int, scenario: str
    ) -> list[str]:
        """Every runtime of `run` registered beforehand, `batch` at a time (all at once is what
        the cold start measures); the IDs of those that got their token."""
        agents = self.agents(run, tokens)
        ids: list[str] = []
        for first in range(0, len(agents), batch):
            part = agents[first : first + batch]
            self.progress.say(f"{scenario}: registering {first + len(part)}/{len(agents)}")
            spec = RunSpec("cold", len(part), 0.0)
            measured = await self._fleet(run, part, deadline=planning.deadline(self.plan, spec))
            ids += list(measured.fleet.connected_at)
        return ids

    async def steady(self) -> SteadyResult:
        """Registered runtimes ask again; Director answers at once (latency 0, capacity C) so
        the figures are the broker's own, plus the simulator's small service time."""
        plan = self.plan
        spec = RunSpec("steady", plan.steady_runtimes, 0.0)
        tokens = await self.tokens_for(spec, self.keys[: spec.n])
        async with self.stack(spec, capacity=plan.capacity) as run:
            ids = await self._register(run, tokens, batch=REGISTER_BATCH, scenario="steady")
            # Each registration used one token of the runtime's rate-limit bucket (burst 5):
            # three concurrent rounds, then one sequential round, over all of them. The
            # concurrent rounds come first so that they, as before, pay for each runtime's
            # first `TokenIssued` Event (a third of their tokens; later ones are aggregated);
            # the sequential round is as long as the fleet (400 by default), so that its p99 is
            # a percentile and not the slowest of a handful.
            issued = await self._load(run, tokens, ids * 3, callers=plan.steady_callers, expect=201)
            single = await self._load(run, tokens, ids, callers=1, expect=201)
            ott = [
                c.duration * 1000
                for c in run.sim.director_calls
                if c.operation == TOKEN and issued.started_wall <= c.at <= issued.ended_wall
            ]
            async with httpx.AsyncClient(timeout=30) as http:
                await run.sim.patch_faults(http, down="503")
            # Open the breaker (threshold consecutive failures), then measure the 503s.
            await self._load(run, tokens, ids[:20], callers=1, expect=503)
            rejected = await self._load(
                run, tokens, ids * 3, callers=plan.steady_callers, expect=503
            )
            rss = max(sample(b.pid).peak_rss_bytes for b in run.brokers)
        return SteadyResult(
            runtimes=len(ids),
            callers=plan.steady_callers,
            capacity=plan.capacity,
            identity_mode=spec.identity_mode,
            issued=issued.figures,
            single=single.figures,
            rejected=rejected.figures,
            director_p50_ms=stats.percentile(ott, 50) if ott else 0.0,
            director_p99_ms=stats.percentile(ott, 99) if ott else 0.0,
            broker_rss_peak_bytes=rss,
        )

    async def _load(
        self,
        run: Run,
        tokens: dict[str, str],
        jobs: Sequence[str],
        *,
        callers: int,
        expect: int,
    ) -> LoadPhase:
        """`callers` concurrent callers work through `jobs` (one request per runtime ID). Each
        caller has a client of its own with one connection, so no shared pool's bookkeeping
        slows the sending side; the harness's CPU for the phase is reported."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        windows: list[tuple[float, float]] = []  # wall clock start, end of each request
        statuses: Counter[str] = Counter()
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        url = run.brokers[0].url
        clients = [
            httpx.AsyncClient(base_url=url, timeout=60, limits=limits) for _ in range(callers)
        ]

        async def caller(http: httpx.AsyncClient) -> None:
            while True:
                try:
                    runtime_id = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                headers = {"Authorization": f"Bearer {tokens[runtime_id]}"}
                started = time.time()
                try:
                    response = await http.post(f"/v1/runtimes/{runtime_id}/token", headers=headers)
                    status = str(response.status_code)
                except httpx.TransportError as exc:  # counted, as an agent would see it
                    status = f"transport error {type(exc).__name__}"
                windows.append((started, time.time()))
                statuses[status] += 1

        try:
            kcp_before = await self.kcp.request_counts()
            cpu_before = sample(run.brokers[0].pid).cpu_seconds
            own_before = _own_cpu()
            started = time.time()
            await asyncio.wait_for(
                asyncio.gather(*(caller(c) for c in clients)), timeout=self.plan.max_run_seconds
            )
            ended = time.time()
            own = _own_cpu() - own_before
            cpu = sample(run.brokers[0].pid).cpu_seconds - cpu_before
            kcp_after = await self.kcp.request_counts()
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        async with httpx.AsyncClient(timeout=30) as http:
            await run.sim.poll_calls(http)
        ms = [(end - start) * 1000 for start, end in windows]
        overhead: list[float] = []
        if callers == 1:
            # One request at a time: the Director calls answered inside a request's window are
            # its own; what is left of its latency is the broker's.
            calls = sorted((c.at, c.duration) for c in run.sim.director_calls if c.at >= started)
            for start, end in windows:
                inside = sum(d for at, d in calls if start <= at <= end)
                overhead.append(max(0.0, (end - start - inside) * 1000))
        figures = LatencyFigures(
            requests=len(ms),
            statuses=dict(statuses),
            p50_ms=stats.percentile(ms, 50),
            p99_ms=stats.percentile(ms, 99),
            max_ms=max(ms),
            seconds=ended - started,
            broker_cpu_seconds=cpu,
            counted=statuses[str(expect)],
            harness_cpu_seconds=own,
            overhead_p50_ms=stats.percentile(overhead, 50) if overhead else None,
            overhead_p99_ms=stats.percentile(overhead, 99) if overhead else None,
            kcp=KcpRequests(delta(kcp_before, kcp_after)),
        )
        self.progress.say(
            f"steady, {callers} caller(s), expecting {expect}: {figures.requests} requests "
            f"{dict(statuses)}, p50 {figures.p50_ms:.1f} ms, p99 {figures.p99_ms:.1f} ms"
        )
        return LoadPhase(figures=figures, started_wall=started, ended_wall=ended)

    # -- connection reports (issue 13) ------------------------------------------------------

    async def reports(self) -> ReportsResult:
        """Registered runtimes send connection reports at the agents' heartbeat.

        The runtimes are registered for real first (in batches, Director answering at once),
        then each reports once (its state is new: the broker writes it). Then the recorded
        report times are spread as a fleet's are in steady state (age uniform between 0 and
        the broker's refresh interval plus half a heartbeat), and for `report_window` seconds
        the runtimes report in turn at the rate N / heartbeat with the state unchanged: what the
        broker spends then, in CPU and KCP writes, is what a fleet of N costs it."""
        plan = self.plan
        spec = RunSpec("reports", plan.report_runtimes, 0.0)
        tokens = await self.tokens_for(spec, self.keys[: spec.n])
        async with self.stack(spec, capacity=plan.capacity) as run:
            ids = await self._register(run, tokens, batch=REPORT_BATCH, scenario="reports")
            url = run.brokers[0].url
            kcp_before = await self.kcp.request_counts()
            warmup = await send_reports(url, tokens, ids, rate=None)
            warmup_done = time.monotonic()
            kcp_after = await self.kcp.request_counts()
            warmup_writes = KcpRequests(delta(kcp_before, kcp_after)).writes
            self.progress.say(f"reports: first round {dict(warmup)}, {warmup_writes} KCP writes")
            refresh = broker_setting("report_refresh_seconds", DEFAULT_REPORT_REFRESH_SECONDS)
            spread = await self.kcp.spread_report_ages(
                run.namespace, [i.lower() for i in ids], oldest=refresh + plan.report_heartbeat / 2
            )
            if not spread:
                self.progress.say("reports: no status.connection.lastReportAt to spread")
            # The broker has seen those status changes, and no runtime reports again within
            # the broker's minimum interval (a heartbeat never does).
            settle = warmup_done + broker_setting("report_min_interval_seconds", 10.0) + 1.0
            await asyncio.sleep(max(5.0, settle - time.monotonic()))
            order = random.Random(7).sample(ids, len(ids))
            count = max(1, int(len(ids) * plan.report_window / plan.report_heartbeat))
            jobs = [order[i % len(order)] for i in range(count)]
            cpu_before = sample(run.brokers[0].pid).cpu_seconds
            kcp_before = await self.kcp.request_counts()
            started = time.monotonic()
            statuses = await send_reports(url, tokens, jobs, rate=len(ids) / plan.report_heartbeat)
            window = time.monotonic() - started
            kcp_after = await self.kcp.request_counts()
            cpu = sample(run.brokers[0].pid).cpu_seconds - cpu_before
        result = ReportsResult(
            runtimes=len(ids),
            heartbeat_seconds=plan.report_heartbeat,
            window_seconds=window,
            warmup_writes=warmup_writes,
            statuses=dict(statuses),
            broker_cpu_seconds=cpu,
            kcp=KcpRequests(delta(kcp_before, kcp_after)),
        )
        self.progress.say(
            f"reports: {result.reports} in {window:.0f} s {dict(statuses)}, broker "
            f"{result.cpu_share * 100:.1f} % of a core, {result.writes_per_second:.2f} KCP writes/s"
        )
        return result

    # -- agent footprint ------------------------------------------------------------------

    async def footprint(self, runtime_cluster: Any) -> FootprintResult:
        """The real agent (`python -m agent`) against a real runtime API server, then idle."""
        spec = RunSpec("footprint", 1, self.plan.latency)
        key = self.keys[0]
        tokens = await self.tokens_for(spec, [key])
        async with self.stack(spec, capacity=self.plan.capacity) as run:
            return await measure_footprint(
                runtime_cluster=runtime_cluster,
                key=key,
                token=tokens[key.runtime_id],
                broker_url=run.brokers[0].url,
                sim=run.sim,
                workdir=run.workdir,
                idle_seconds=self.config.idle_seconds,
                progress=self.progress,
            )


@dataclass(frozen=True)
class LoadPhase:
    figures: LatencyFigures
    started_wall: float
    ended_wall: float


# The broker's clock-skew allowance for "created after the watch listed", and a second more.
CERTAINLY_NEW_AFTER = registration_state.SKEW_SECONDS + 1.0


def wait_kymas_cached(brokers: Sequence[Broker], n: int, *, timeout: float = 300.0) -> None:
    """Until every broker's Kyma cache holds the run's `n` Kymas (a fleet that asked before
    would be refused as unknown runtimes)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as http:
        for broker in brokers:
            while True:
                samples = unlabelled_samples(http.get(f"{broker.url}/metrics").text)
                if samples.get("broker_kymas_cached", 0.0) >= n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{broker.url} cached fewer than {n} Kymas in {timeout} s")
                time.sleep(0.2)


def breaker_opened_at(scrapes: Iterable[Mapping[str, float]], now: float) -> float | None:
    """When the first broker whose breaker is open says it opened, None while all are closed.
    The broker's own moment: polling alone lands up to a poll period (plus the scrape) late, and
    a call of the opening burst then counted as a probe. A moment in the future (a clock that
    jumped, a hostile gauge) or none at all falls back to `now`."""
    for samples in scrapes:
        if samples.get(BREAKER_GAUGE) == 1.0:
            opened = samples.get(BREAKER_OPENED_GAUGE)
            return opened if opened and opened <= now else now
    return None


def admission_row(samples: Mapping[str, float], now: float) -> str:
    """One CSV row of `admission-<i>.csv`: the time, then ADMISSION_GAUGES (empty: missing)."""
    cells = ["" if (v := samples.get(name)) is None else f"{v:g}" for name in ADMISSION_GAUGES]
    return ",".join([f"{now:.1f}", *cells])


def broker_setting(name: str, fallback: float) -> float:
    """The broker's default for one of its settings (what the benchmark's broker runs with)."""
    field_info = Settings.model_fields.get(name)
    default = getattr(field_info, "default", None)
    return float(default) if isinstance(default, int | float) else fallback


def connection_report(token: str) -> dict[str, Any]:
    """What an agent whose runtime is connected reports (the same every time: no change)."""
    return {
        "connectionState": "Connected",
        "certificateNotAfter": "2027-06-01T00:00:00Z",
        "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
        "observedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def send_reports(
    url: str, tokens: dict[str, str], jobs: Sequence[str], *, rate: float | None
) -> Counter[str]:
    """One connection report per job (a runtime ID), `REPORT_SENDERS` at a time; with `rate`,
    job i is not sent before i / rate seconds (a heartbeat spread over the fleet)."""
    statuses: Counter[str] = Counter()
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in enumerate(jobs):
        queue.put_nowait(item)
    started = time.monotonic()
    limits = httpx.Limits(max_connections=REPORT_SENDERS, max_keepalive_connections=REPORT_SENDERS)

    async def sender(http: httpx.AsyncClient) -> None:
        while True:
            try:
                index, runtime_id = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if rate is not None:
                await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
            token = tokens[runtime_id]
            try:
                response = await http.post(
                    f"/v1/runtimes/{runtime_id}/connection",
                    headers={"Authorization": f"Bearer {token}"},
                    json=connection_report(token),
                )
                statuses[str(response.status_code)] += 1
            except httpx.TransportError as exc:
                statuses[f"transport error {type(exc).__name__}"] += 1

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        await asyncio.gather(*(sender(http) for _ in range(REPORT_SENDERS)))
    return statuses


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def label_value(labels: dict[str, Any], key: str) -> str | None:
    """Director label values are JSON: a string, or a list of strings for some labels."""
    value = labels.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else str(value)


def write_calls(path: Path, calls: Sequence[DirectorCall], *, down_at: float, up_at: float) -> None:
    """Every call that reached Compass in an outage run, seconds from the moment it went down,
    into the run's work folder (kept with --keep-workdir): which call broke a probe window."""
    with path.open("w") as out:
        out.write(f"# down at {down_at:.3f}, up at {up_at:.3f} (unix seconds)\n")
        out.write("seconds_after_down,endpoint,operation,outcome,status,duration\n")
        for c in sorted(calls, key=lambda c: c.at):
            status = "" if c.status is None else c.status
            out.write(
                f"{c.at - down_at:.3f},{c.endpoint},{c.operation},{c.outcome},{status},"
                f"{c.duration:.4f}\n"
            )
