"""The composition root: builds every part from `Settings` and runs them together.

Holds: one KCP client, one Director HTTP client and one of everything else per process; the
reconciler acts only while this replica holds the Lease; on SIGTERM/SIGINT the server stops
accepting, in-flight requests finish, background tasks stop, the Lease is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Generator

import httpx
import uvicorn

from control_plane_broker import circuit_breaker as cb
from control_plane_broker.api.app import create_app
from control_plane_broker.director.client import DirectorClient
from control_plane_broker.director.guard import DirectorGuard
from control_plane_broker.director.oauth import OAuthTokenSource
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.identity.verifier import CountingVerifier, Verifier, XfccVerifier
from control_plane_broker.issuing import TokenIssuer
from control_plane_broker.kube.client import KubeClient
from control_plane_broker.kube.config import ClusterAccess
from control_plane_broker.kube.events import EventRecorder
from control_plane_broker.kube.kyma_cache import KymaCache
from control_plane_broker.kube.lease import LeaderElector
from control_plane_broker.kube.mappings import MappingRepository
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.metrics import Metrics
from control_plane_broker.ratelimit import BucketPolicy, RateLimiter
from control_plane_broker.reconciler import Reconciler
from control_plane_broker.registration.service import RegistrationService
from control_plane_broker.settings import Settings, load_director_credentials

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: `run` owns the shutdown order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def replica_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def run(settings: Settings, *, kcp_access: ClusterAccess) -> None:  # noqa: PLR0915
    if not settings.director_url or settings.director_credentials_file is None:
        raise SystemExit("BROKER_DIRECTOR_URL and BROKER_DIRECTOR_CREDENTIALS_FILE are required")
    credentials = load_director_credentials(settings.director_credentials_file)
    me = replica_identity()
    wall, mono = time.time, time.monotonic
    metrics = Metrics()

    kcp = KubeClient(kcp_access)
    cache = KymaCache(kcp, namespace=settings.kcp_namespace)
    repo = MappingRepository(kcp, namespace=settings.kcp_namespace)
    events = EventRecorder(
        kcp, namespace=settings.kcp_namespace, component="compass-broker", clock=wall
    )
    http = httpx.AsyncClient(timeout=httpx.Timeout(settings.director_timeout_seconds))
    guard = DirectorGuard(
        policy=cb.BreakerPolicy(
            failure_threshold=settings.breaker_failure_threshold,
            open_seconds=settings.breaker_open_seconds,
        ),
        max_concurrency=settings.director_max_concurrency,
        queue_timeout=settings.director_queue_timeout_seconds,
        clock=mono,
        on_state=metrics.on_breaker_state,
    )
    oauth = OAuthTokenSource(http, credentials, scope=settings.director_scope, clock=mono)
    director = DirectorClient(http=http, url=settings.director_url, oauth=oauth, guard=guard)
    registration = RegistrationService(
        settings=settings, repo=repo, director=director, metrics=metrics, me=me, clock=wall
    )
    runtime_access = RuntimeAccess(
        kcp,
        namespace=settings.kcp_namespace,
        ttl_seconds=settings.runtime_access_cache_seconds,
        clock=mono,
    )
    allowed = settings.allowed_service_account_set()
    inner: Verifier
    if settings.identity_mode == "tokenreview":
        inner = TokenReviewVerifier(
            runtime_access,
            audience=settings.audience,
            allowed=allowed,
            cache_max_seconds=settings.identity_cache_max_seconds,
            clock=wall,
        )
    elif settings.identity_mode == "jwks":
        inner = JwksVerifier(
            runtime_access,
            audience=settings.audience,
            allowed=allowed,
            issuer_url=settings.jwks_issuer_url,
            http=http,
            clock=mono,
        )
    else:
        inner = XfccVerifier(trusted=settings.xfcc_trusted)
    issuer = TokenIssuer(
        settings=settings,
        cache=cache,
        verifier=CountingVerifier(inner, metrics),
        registration=registration,
        director=director,
        repo=repo,
        events=events,
        limiter=RateLimiter(
            BucketPolicy(
                burst=settings.rate_limit_burst, per_second=settings.rate_limit_per_minute / 60
            )
        ),
        clock=mono,
        wall=wall,
    )

    def ready() -> bool:
        metrics.cache_synced.set(1 if cache.synced else 0)
        return cache.synced

    app = create_app(
        issuer=issuer,
        metrics=metrics,
        ready=ready,
        jitter_max=settings.retry_after_jitter_seconds,
    )

    elector = LeaderElector(
        kcp,
        namespace=settings.lease_namespace,
        name=settings.lease_name,
        me=me,
        duration=settings.lease_duration_seconds,
        renew_every=settings.lease_renew_seconds,
        clock=wall,
        on_change=lambda leading: metrics.leader.set(1 if leading else 0),
    )

    def leading() -> bool:
        return elector.leading if settings.leader_election else True

    background = [asyncio.create_task(cache.run(), name="kyma-cache")]
    if settings.reconciler_enabled:
        reconciler = Reconciler(
            settings=settings,
            cache=cache,
            repo=repo,
            director=director,
            events=events,
            metrics=metrics,
            leading=leading,
            clock=wall,
        )
        if settings.leader_election:
            background.append(asyncio.create_task(elector.run(), name="lease"))
        background.append(asyncio.create_task(reconciler.run_worker(), name="reconcile"))
        background.append(asyncio.create_task(reconciler.run_sweeps(), name="sweep"))

    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    server = _Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    host, port = sock.getsockname()[:2]
    log.info(
        "listening",
        extra={"host": host, "port": port, "identity": me, "mode": settings.identity_mode},
    )
    try:
        await server.serve(sockets=[sock])
    finally:
        log.info("shutting down")
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if settings.leader_election:
            await elector.release()
        await runtime_access.aclose()
        await http.aclose()
        await kcp.aclose()
        sock.close()
