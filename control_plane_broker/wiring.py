"""The composition root: builds every part from `Settings` and runs them together.

Holds: one KCP client, and one HTTP client per upstream sized for its job (Director calls are
few and bounded by the concurrency limit; OAuth is one call at a time; issuer keys and runtime
API servers are many), so a burst towards one upstream never queues the calls to another; every
background task runs supervised (restarted with backoff, counted); the reconciler acts only while
this replica holds the Lease; on SIGTERM/SIGINT the server stops accepting, in-flight requests
finish, background tasks stop, the Lease is released.

`run` reads top to bottom as the order of start-up; each part is built by one factory below it.
Every resource is registered on one `AsyncExitStack` as soon as it exists, so it is closed when
start-up fails after it, and when another resource's close fails.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import certifi
import httpx
from starlette.types import ASGIApp

from control_plane_broker.api.access import AccessLog
from control_plane_broker.api.app import Health, create_app
from control_plane_broker.api.first_contact_middleware import FirstContactLimitMiddleware
from control_plane_broker.api.server import bind, build_server
from control_plane_broker.backoff import watch_backoff
from control_plane_broker.connections.report_rules import fleet
from control_plane_broker.connections.report_service import ConnectionReporter
from control_plane_broker.director.graphql_client import DirectorClient
from control_plane_broker.director.oauth import CredentialsFile, OAuthTokenSource
from control_plane_broker.director.uncertain_answers import UncertainAnswers
from control_plane_broker.enrolment.enrolment_service import EnrolmentVerifier
from control_plane_broker.errors import FirstContactsBusy
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.runtime_proof import RuntimeProof
from control_plane_broker.identity.screening import ScreeningVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.identity.verifier import CountingVerifier, Verifier, XfccVerifier
from control_plane_broker.issuing.token_issuer import TokenIssuer
from control_plane_broker.kube.caches import kyma_informer, mapping_informer
from control_plane_broker.kube.kyma_events import KymaEvents
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.kyma import KymaView
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload import circuit_breaker as cb
from control_plane_broker.overload.deferred_writes import DeferredWrites
from control_plane_broker.overload.director_limiter import DirectorLimiter
from control_plane_broker.overload.identity_budget import IdentityBudget
from control_plane_broker.overload.rate_limit import BucketPolicy, RateLimiter
from control_plane_broker.reconciler.kyma_reconciler import KymaReconciler
from control_plane_broker.reconciler.mapping_status import StatusRecorder
from control_plane_broker.registration.service import Hook, RegistrationService
from control_plane_broker.registration.state import Mapping
from control_plane_broker.revocation.deny_list_file import DenyListFile
from control_plane_broker.revocation.revocation_gate import RevocationGate
from control_plane_broker.settings import CredentialsInvalid, DirectorCredentials, Settings
from control_plane_broker.supervisor import LoopWatch, Supervisor
from kubeapi import ClusterAccess, EventRecorder, Informer, KubeClient, LeaderElector

log = logging.getLogger(__name__)

HEADER_TIMEOUT_SECONDS = 10.0
WEDGE_SECONDS = 5.0
RECONCILE_WORKERS = 4
EVENT_WRITE_INTERVAL_SECONDS = 30.0  # repeats of one Event are written at most this often
wall, mono = time.time, time.monotonic


async def run(
    settings: Settings, *, kcp_access: ClusterAccess, after_register: Hook | None = None
) -> None:
    """Builds the broker, serves until SIGTERM/SIGINT, then stops and closes everything.

    `after_register` is called right after Director registered a runtime (the crash test's hook).
    """
    credentials = director_credentials(settings)
    me = replica_identity()
    metrics = Metrics()
    async with AsyncExitStack() as stack:
        director, director_limiter, oauth = director_side(
            settings, credentials, stack=stack, metrics=metrics
        )
        deferred = DeferredWrites(
            busy=director_limiter.backlogged, clock=mono, on_depth=metrics.deferred_writes.set
        )
        kcp = control_plane(
            settings, kcp_access, stack=stack, me=me, metrics=metrics, deferred=deferred
        )
        registration = RegistrationService(
            settings=settings.registration_settings(),
            repo=kcp.repo,
            cache=kcp.mappings,
            director=director,
            metrics=metrics,
            me=me,
            clock=wall,
            watch=kcp.mappings,
            after_register=after_register,
        )
        verifier = identity(settings, kcp=kcp, stack=stack, metrics=metrics)
        issuer, reporter = endpoints(
            settings,
            kcp=kcp,
            verifier=verifier,
            registration=registration,
            director=director,
            director_limiter=director_limiter,
            metrics=metrics,
            deferred=deferred,
        )
        supervisor = Supervisor(
            on_start=metrics.on_task_started, on_restart=metrics.on_task_restarted
        )
        loop_watch = LoopWatch(wedge_seconds=WEDGE_SECONDS, on_lag=metrics.loop_lag.set)
        background_tasks(
            settings,
            supervisor=supervisor,
            loop_watch=loop_watch,
            kcp=kcp,
            director=director,
            registration=registration,
            deferred=deferred,
            stack=stack,
            me=me,
            metrics=metrics,
        )
        health = Health(
            ready=readiness(settings, supervisor, kcp, metrics),
            live=loop_watch.healthy,
            degraded=degraded(oauth),
        )
        front = with_first_contact_limit(
            settings,
            app=create_app(
                issuer=issuer,
                reporter=reporter,
                metrics=metrics,
                health=health,
                jitter_max=settings.retry_after_jitter_seconds,
                access_log=False,
                api_docs=settings.api_docs,
            ),
            verifier=verifier,
            kymas=kcp.kymas,
            metrics=metrics,
        )
        await serve_http(settings, front, stack=stack, me=me)


# --- the parts, in the order `run` builds them -------------------------------------------------


def director_credentials(settings: Settings) -> CredentialsFile:
    """The credentials file, read now and again whenever it changes (a rotated Secret needs no
    restart)."""
    if not settings.director_url or settings.director_credentials_file is None:
        raise SystemExit("BROKER_DIRECTOR_URL and BROKER_DIRECTOR_CREDENTIALS_FILE are required")
    try:
        return CredentialsFile(settings.director_credentials_file, clock=mono)
    except (OSError, CredentialsInvalid) as exc:
        raise SystemExit(f"BROKER_DIRECTOR_CREDENTIALS_FILE: {exc}") from None


def replica_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ControlPlane:
    """The KCP client and what reads and writes through it."""

    client: KubeClient
    kymas: Informer[KymaView]
    mappings: Informer[Mapping]
    repo: MappingRepository
    recorder: EventRecorder
    events: KymaEvents
    status: StatusRecorder
    runtime_access: RuntimeAccess


def control_plane(
    settings: Settings,
    access: ClusterAccess,
    *,
    stack: AsyncExitStack,
    me: str,
    metrics: Metrics,
    deferred: DeferredWrites,
) -> ControlPlane:
    ns = settings.kcp_namespace
    kcp = KubeClient(
        access,
        user_agent="compass-broker",
        timeout=10.0,
        # httpcore polls every idle pooled connection on each request: a few busy
        # connections serve a burst faster than many idle ones. 4 used less CPU at N = 1,000,
        # but 8 is what the last good two-replica run at N = 5,000 had (docs/benchmarks.md).
        max_connections=8,
        on_request=metrics.on_kube_request,
    )
    stack.push_async_callback(kcp.aclose)
    kymas = kyma_informer(kcp, namespace=ns, delay=watch_backoff)
    mappings = mapping_informer(kcp, namespace=ns, delay=watch_backoff)
    repo = MappingRepository(kcp, namespace=ns)
    recorder = EventRecorder(
        kcp,
        namespace=ns,
        component="compass-broker",
        host=me,
        min_write_interval=EVENT_WRITE_INTERVAL_SECONDS,
    )
    events = KymaEvents(recorder, namespace=ns, deferred=deferred)

    async def kubeconfig_invalid(runtime_id: str, problem: str) -> None:
        kyma = kymas.get(runtime_id.lower())
        if kyma is not None:
            await events.record(
                kyma_name=kyma.name,
                kyma_uid=kyma.uid,
                reason="RuntimeKubeconfigInvalid",
                message=f"the runtime kubeconfig Secret cannot be used: {problem}",
                warning=True,
            )

    runtime_access = RuntimeAccess(
        kcp,
        namespace=ns,
        secret_name_pattern=settings.runtime_kubeconfig_secret_pattern,
        ttl_seconds=settings.runtime_access_cache_seconds,
        clock=mono,
        unreachable_seconds=settings.runtime_unreachable_seconds,
        on_invalid=kubeconfig_invalid,
    )
    stack.push_async_callback(runtime_access.aclose)
    metrics.watch_fleet(lambda: fleet(mappings.values(), now=wall()))
    metrics.watch_kymas(lambda: len(kymas.names()))
    return ControlPlane(
        client=kcp,
        kymas=kymas,
        mappings=mappings,
        repo=repo,
        recorder=recorder,
        events=events,
        status=StatusRecorder(repo=repo, cache=mappings, events=events, clock=wall),
        runtime_access=runtime_access,
    )


def director_side(
    settings: Settings,
    credentials: DirectorCredentials | CredentialsFile,
    *,
    stack: AsyncExitStack,
    metrics: Metrics,
) -> tuple[DirectorClient, DirectorLimiter, OAuthTokenSource]:
    """Director's client behind its limiter, with an HTTP client each for Director and OAuth;
    the token source too, which knows whether the broker's credentials are refused."""
    c = settings.director_max_concurrency
    director_http = httpx.AsyncClient(
        timeout=httpx.Timeout(settings.director_timeout_seconds),
        limits=httpx.Limits(max_connections=c + 2, max_keepalive_connections=c + 2),
        trust_env=False,
    )
    stack.push_async_callback(director_http.aclose)
    oauth_http = httpx.AsyncClient(
        timeout=httpx.Timeout(settings.director_timeout_seconds),
        limits=httpx.Limits(max_connections=2, max_keepalive_connections=2),
        trust_env=False,
    )
    stack.push_async_callback(oauth_http.aclose)
    director_limiter = DirectorLimiter(
        policy=cb.BreakerPolicy(
            failure_threshold=settings.breaker_failure_threshold,
            open_seconds=settings.breaker_open_seconds,
        ),
        max_concurrency=c,
        queue_timeout=settings.director_queue_timeout_seconds,
        clock=mono,
        on_state=metrics.on_breaker_state,
    )
    metrics.watch_director(director_limiter.snapshot)
    metrics.watch_breaker(director_limiter.refusing)
    oauth = OAuthTokenSource(
        oauth_http,
        credentials,
        scope=settings.director_scope,
        clock=mono,
        on_verdict=metrics.on_credentials_verdict,
    )
    # Director calls share the main loop: a loop in a thread of its own made admitted requests
    # outlast the agents' 30 s timeout at N = 5,000 (the two threads contend for the interpreter).
    uncertain = UncertainAnswers(
        count=lambda operation: metrics.uncertain_answers.labels(operation).inc(), clock=mono
    )
    director = DirectorClient(
        http=director_http,
        url=settings.director_url,
        oauth=oauth,
        limiter=director_limiter,
        on_uncertain=uncertain.record,
    )
    return director, director_limiter, oauth


def identity(
    settings: Settings, *, kcp: ControlPlane, stack: AsyncExitStack, metrics: Metrics
) -> CountingVerifier:
    """The proof of the identity mode, with BYOC enrolment where it applies, behind the identity
    budget (a failure budget and a share per runtime ID, `overload/identity_budget`) in the
    bearer modes, behind the cheap refusals, counted."""
    keys_http = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0),
        limits=httpx.Limits(max_connections=16, max_keepalive_connections=16),
        trust_env=False,
        verify=issuer_tls(settings.issuer_ca_file),
    )
    stack.push_async_callback(keys_http.aclose)
    allowed = settings.allowed_service_account_set()
    mode = settings.identity_mode
    # BYOC enrolment needs the issuer's keys: from the JWKS verifier itself when it is not pinned
    # to one issuer, from one built for enrolment alone in tokenreview mode.
    enrol = settings.byoc_enrolment and (
        mode == "tokenreview" or (mode == "jwks" and not settings.jwks_issuer_url)
    )
    jwks: JwksVerifier | None = None
    if mode == "jwks" or enrol:
        jwks = JwksVerifier(
            kcp.runtime_access,
            audience=settings.audience,
            allowed=allowed,
            issuer_url=settings.jwks_issuer_url if mode == "jwks" else "",
            http=keys_http,
            clock=mono,
        )
    inner: Verifier
    if mode == "tokenreview":
        inner = TokenReviewVerifier(
            kcp.runtime_access,
            audience=settings.audience,
            allowed=allowed,
            cache_max_seconds=settings.identity_cache_max_seconds,
            clock=wall,
        )
    elif mode == "jwks" and jwks is not None:
        inner = jwks
    else:
        inner = XfccVerifier(
            trusted=settings.xfcc_trusted,
            deny_list_configured=settings.xfcc_deny_list_file is not None,
        )
    if enrol and jwks is not None:
        inner = EnrolmentVerifier(
            inner,
            pinned=jwks,
            kymas=kcp.kymas,
            mappings=kcp.mappings,
            repo=kcp.repo,
            events=kcp.events,
            namespace=settings.kcp_namespace,
            audience=settings.audience,
            allowed=allowed,
            required_module=settings.module_name if settings.module_policy == "required" else None,
            clock=mono,
            wall=wall,
        )
    if mode != "xfcc":  # a check of a forwarded certificate costs no request: no budget
        inner = IdentityBudget(
            inner,
            budget=BucketPolicy(
                burst=settings.identity_failure_burst,
                per_second=settings.identity_failures_per_minute / 60,
            ),
            per_runtime=settings.first_contacts_per_runtime,
            clock=mono,
        )
    screened = ScreeningVerifier(
        inner, kymas=kcp.kymas, audience=settings.audience if mode != "xfcc" else None
    )
    return CountingVerifier(screened, metrics)


def endpoints(
    settings: Settings,
    *,
    kcp: ControlPlane,
    verifier: CountingVerifier,
    registration: RegistrationService,
    director: DirectorClient,
    director_limiter: DirectorLimiter,
    metrics: Metrics,
    deferred: DeferredWrites,
) -> tuple[TokenIssuer, ConnectionReporter]:
    """What the two endpoints call: the token issuer and the connection reporter, each behind
    the one chain that proves a runtime (with the revocation gate) and its own per-runtime
    rate limit."""
    gate = RevocationGate(
        mappings=kcp.mappings,
        kymas=kcp.kymas,
        events=kcp.events,
        metrics=metrics,
        deny_list=deny_list(settings.xfcc_deny_list_file),
    )
    proof = RuntimeProof(
        cache=kcp.kymas,
        verifier=verifier,
        gate=gate,
        module=settings.module_name,
        module_required=settings.module_policy == "required",
    )
    issuer = TokenIssuer(
        request_deadline_seconds=settings.request_deadline_seconds,
        proof=proof,
        registration=registration,
        director=director,
        director_limiter=director_limiter,
        status=kcp.status,
        limiter=RateLimiter(
            BucketPolicy(
                burst=settings.rate_limit_burst, per_second=settings.rate_limit_per_minute / 60
            )
        ),
        clock=mono,
        after_answer=deferred.defer,
    )
    reporter = ConnectionReporter(
        settings=settings.report_settings(),
        proof=proof,
        mappings=kcp.mappings,
        status=kcp.status,
        limiter=RateLimiter(
            BucketPolicy(burst=1, per_second=1 / settings.report_min_interval_seconds)
        ),
        clock=mono,
        wall=wall,
    )
    return issuer, reporter


def background_tasks(
    settings: Settings,
    *,
    supervisor: Supervisor,
    loop_watch: LoopWatch,
    kcp: ControlPlane,
    director: DirectorClient,
    registration: RegistrationService,
    deferred: DeferredWrites,
    stack: AsyncExitStack,
    me: str,
    metrics: Metrics,
) -> None:
    """Starts the watches, the Event flusher, the deferred writes and, where enabled, the
    reconciler under the Lease; registers their stop: tasks first, then deferred writes and
    pending Events written, then the Lease released."""
    elector = LeaderElector(
        kcp.client,
        namespace=settings.lease_namespace,
        name=settings.lease_name,
        identity=me,
        duration=settings.lease_duration_seconds,
        renew_every=settings.lease_renew_seconds,
        on_change=lambda leading: metrics.leader.set(1 if leading else 0),
    )
    if settings.leader_election and settings.reconciler_enabled:
        stack.push_async_callback(elector.release)
    stack.push_async_callback(kcp.recorder.flush)
    stack.push_async_callback(kcp.events.drain)
    stack.push_async_callback(supervisor.stop)

    def leading() -> bool:
        return elector.leading if settings.leader_election else True

    supervisor.start("loop-watch", loop_watch.run)
    supervisor.start("kyma-watch", kcp.kymas.run)
    supervisor.start("mapping-watch", kcp.mappings.run)
    supervisor.start("event-flusher", kcp.recorder.run_flusher, required=False)
    supervisor.start("deferred-writes", deferred.run)
    if not settings.reconciler_enabled:
        return
    reconciler = KymaReconciler(
        settings=settings.reconciler_settings(),
        cache=kcp.kymas,
        mappings=kcp.mappings,
        repo=kcp.repo,
        director=director,
        registration=registration,
        events=kcp.events,
        status=kcp.status,
        metrics=metrics,
        leading=leading,
        clock=wall,
    )
    if settings.leader_election:
        supervisor.start("lease", elector.run)
    for index in range(RECONCILE_WORKERS):
        supervisor.start(f"reconcile-{index}", reconciler.run_worker)
    supervisor.start("sweep", reconciler.run_sweeps)
    supervisor.start("connection-check", reconciler.run_connection_checks)


def readiness(
    settings: Settings, supervisor: Supervisor, kcp: ControlPlane, metrics: Metrics
) -> Callable[[], tuple[bool, list[str]]]:
    """Ready: every required task up, both caches synced and heard from recently."""
    stale_after = settings.cache_stale_seconds

    def ready() -> tuple[bool, list[str]]:
        problems = [f"task {name} is down" for name in supervisor.down()]
        for informer in (kcp.kymas, kcp.mappings):
            if not informer.synced:
                problems.append(f"{informer.name} not synced")
            elif not cache_fresh(informer, stale_after):
                problems.append(f"{informer.name} not heard from in {stale_after:.0f} s")
        metrics.cache_synced.set(1 if kcp.kymas.synced else 0)
        return not problems, problems

    return ready


def degraded(oauth: OAuthTokenSource) -> Callable[[], list[str]]:
    """What /readyz reports without failing readiness (`api.app.Health`): the broker's
    credentials refused by Director's OAuth token endpoint."""

    def report() -> list[str]:
        refusal = oauth.refusal()
        return [] if refusal is None else [refusal]

    return report


def cache_fresh(informer: Informer[KymaView] | Informer[Mapping], bound: float) -> bool:
    """Synced, and heard from the API server (event, bookmark or list) within `bound`."""
    contact = informer.last_contact
    return informer.synced and contact is not None and time.monotonic() - contact < bound


def with_first_contact_limit(
    settings: Settings,
    *,
    app: ASGIApp,
    verifier: CountingVerifier,
    kymas: Informer[KymaView],
    metrics: Metrics,
) -> FirstContactLimitMiddleware:
    """The app behind the first-contact limit."""

    def refused(endpoint: str) -> None:
        counter = metrics.connection_reports if endpoint == "connection" else metrics.token_requests
        counter.labels(FirstContactsBusy.slug).inc()

    limited = FirstContactLimitMiddleware(
        app,
        capacity=settings.first_contacts_in_progress,
        # Not limited: checking them needs no network (proven recently: cached; no Kyma: refused
        # from the cache).
        is_known=lambda runtime_id: (
            verifier.proved_recently(runtime_id) or kymas.get(runtime_id.lower()) is None
        ),
        per_runtime=settings.first_contacts_per_runtime,
        # Half the Director queue's: what passes the limit may still wait that long for Director,
        # and both together must stay well inside the agent's 30 s timeout.
        max_wait=settings.director_queue_timeout_seconds / 2,
        on_refused=refused,
    )
    metrics.watch_first_contacts(lambda: limited.waiting)
    return limited


async def serve_http(
    settings: Settings, front: FirstContactLimitMiddleware, *, stack: AsyncExitStack, me: str
) -> None:
    """Serves until SIGTERM or SIGINT; in-flight requests finish."""
    # What start-up made (modules, settings, clients, the app) lives as long as the process:
    # frozen out of the collector, so that a full collection walks only what requests made
    # (full collections of 26-90 ms before, 17-25 ms after, in the steady-state benchmark).
    gc.freeze()
    sock = bind(settings.host, settings.port)
    stack.callback(sock.close)
    stack.callback(log.info, "shutting down")
    server = build_server(AccessLog(front), header_timeout=HEADER_TIMEOUT_SECONDS)
    loop = asyncio.get_running_loop()
    stop: Callable[[], None] = lambda: setattr(server, "should_exit", True)  # noqa: E731
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    host, port = sock.getsockname()[:2]
    log.info(
        "listening",
        extra={"host": host, "port": port, "identity": me, "mode": settings.identity_mode},
    )
    await server.serve(sockets=[sock])


def issuer_tls(ca_file: Path | None) -> ssl.SSLContext | bool:
    """The public CAs, plus the operator's own for issuers behind a private CA."""
    if ca_file is None:
        return True
    context = ssl.create_default_context(cafile=certifi.where())
    context.load_verify_locations(cafile=str(ca_file))
    return context


def deny_list(path: Path | None) -> DenyListFile | None:
    if path is None:
        return None
    try:
        return DenyListFile(path)
    except OSError as exc:
        raise SystemExit(f"BROKER_XFCC_DENY_LIST_FILE {path}: {exc.strerror}") from None
