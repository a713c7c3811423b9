"""The level-based loop: gather everything, `decide.plan`, carry out one thing, record it.

Always holds: watch events only `trigger()` the loop; every turn re-reads the world from the
API server; at most one token request runs at a time and a pull keeps its own backoff across
turns (a turn that still plans the same action leaves it running, a turn that plans anything
else cancels it while it is still asking — a token once received is always written, since it was
spent the moment the broker answered); the loop sleeps until a trigger, the plan's WAIT deadline,
the next connection report or the resync period — never a hot loop; metrics and Events are
recorded here only; tokens are never logged.

Connection reports ride on the same loop: each turn builds the report from what it just read
(`agent.connection_report`) and, when reports are allowed by the plan and one is due, starts it as a
task of its own next to the token request — so a report never waits for a pull, a pull never waits
for a report, and the report's deadline only shortens the loop's sleep. Reports need the very
objects each turn reads anyway, and they stop and start with the plan (module disabled, revoked, not
the lease holder) without a second loop deciding the same things.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent import connection_report, decide, discovery
from agent.broker_client import BrokerClient
from agent.cluster_objects import (
    HANDED_OVER_ANNOTATION,
    Connection,
    ConnectionState,
    KymaView,
    TokenRecord,
    fingerprint,
)
from agent.decide import (
    Action,
    Observed,
    Plan,
    Reason,
    Refusal,
    ReportRefusal,
    Revocation,
    Rules,
)
from agent.kube import resources
from agent.kube import secret as secret_io
from agent.kube.event_reasons import EventReason, event_type
from agent.metrics import AgentMetrics
from agent.outcomes import Accepted, Issued, Outcome, Refused, ReportOutcome, Temporary
from agent.retry_policy import RandomSource, RetryPolicy, jittered, next_delay
from agent.settings import AgentSettings, ModuleSignal
from kubeapi import EventRecorder, KubeClient, KubeError, KubeUnavailable, NotFound, ObjectRef

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
# Attempts in a row without any HTTP answer from the broker before the agent reports not ready.
UNREACHABLE_AFTER = 3
# How much of the operator's reason goes into an Event message and the /readyz body.
DETAIL_CHARS = decide.DETAIL_CHARS
NEVER = float("inf")


@dataclass(frozen=True)
class Gathered:
    observed: Observed
    kyma: KymaView | None


def rules_from(settings: AgentSettings) -> Rules:
    return Rules(
        handover_grace=timedelta(seconds=settings.handover_grace),
        connection_grace=timedelta(seconds=settings.connection_grace),
        refusal_cadence=timedelta(seconds=settings.refusal_cadence),
        delete_secret_on_disable=settings.delete_secret_on_disable,
        spacing=settings.retry_policy,
        runtime_agent_min_sync=timedelta(seconds=settings.runtime_agent_min_sync),
    )


class Reconciler:
    def __init__(
        self,
        *,
        settings: AgentSettings,
        kube: KubeClient,
        broker: BrokerClient,
        events: EventRecorder,
        metrics: AgentMetrics,
        clock: Clock,
        rng: RandomSource | None = None,
    ) -> None:
        self._settings = settings
        self._rules = rules_from(settings)
        self._policy: RetryPolicy = settings.retry_policy
        self._kube = kube
        self._broker = broker
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._wake = asyncio.Event()
        self._pull: asyncio.Task[None] | None = None
        self._pull_action = Action.PULL  # what the task in `_pull` does: PULL or RECHECK
        self._storing_token = False  # the task in `_pull` holds an issued token and writes it
        self._report: asyncio.Task[None] | None = None
        self._schedule = connection_report.Schedule()
        self._revocation: Revocation | None = None
        self._report_refusal: ReportRefusal | None = None
        self._refusal: Refusal | None = None
        self._last_pull_at: datetime | None = None
        self._pull_streak = 0
        self._last_connection_state: str | None = None
        self.last_plan: Plan | None = None
        self.discovery_problems: tuple[str, ...] = ()
        self._unreachable_streak = 0  # broker attempts in a row that got no HTTP answer
        self._unanswered_reason = ""
        self.turns = 0
        self.alive = True
        self._background: set[asyncio.Task[None]] = set()

    def trigger(self) -> None:
        self._wake.set()

    # -- gathering -----------------------------------------------------------------

    async def gather(self) -> Gathered:
        s = self._settings
        kyma_raw = await self._kube.get_or_none(f"{resources.kymas(s.namespace)}/{s.kyma_name}")
        kyma = KymaView.from_object(kyma_raw) if kyma_raw is not None else None
        connectors: list[str] = []
        if ModuleSignal.APPLICATIONCONNECTOR_CR in s.module_signals:
            connectors = await self._application_connectors()
        enabled = (
            ModuleSignal.KYMA_SPEC in s.module_signals and bool(kyma and kyma.module_in_spec)
        ) or (ModuleSignal.APPLICATIONCONNECTOR_CR in s.module_signals and bool(connectors))
        discovered = await self._discover(kyma)
        if discovered.broker is not None:
            self._broker.point_at(discovered.broker.value)
        runtime_id = discovered.runtime_id.value if discovered.runtime_id else None
        secret_raw = await secret_io.read_secret(
            self._kube, namespace=s.namespace, name=s.secret_name
        )
        connection_raw = await self._kube.get_or_none(
            f"{resources.compass_connections()}/{resources.COMPASS_CONNECTION_NAME}"
        )
        observed = Observed(
            now=self._clock(),
            module_enabled=enabled,
            runtime_id=runtime_id,
            secret=TokenRecord.from_secret(secret_raw) if secret_raw is not None else None,
            connection=Connection.from_object(connection_raw)
            if connection_raw is not None
            else None,
            fingerprint=fingerprint(
                module_enabled=enabled,
                runtime_id=runtime_id,
                kyma=kyma,
                application_connectors=connectors,
                broker_url=discovered.broker.value if discovered.broker else None,
            ),
            kyma_deleting=bool(kyma and kyma.deleting),
            broker_known=discovered.broker is not None,
            last_refusal=self._refusal,
            last_pull_at=self._last_pull_at,
            pull_streak=self._pull_streak,
            revocation=self._revocation,
        )
        return Gathered(observed=observed, kyma=kyma)

    async def _discover(self, kyma: KymaView | None) -> discovery.Discovered:
        s = self._settings
        configmap = await self._kube.get_or_none(
            f"{resources.configmaps(s.namespace)}/{discovery.CONFIGMAP_NAME}"
        )
        webhook = None
        if s.broker_base is None and s.broker_url_template:
            webhook = await self._kube.get_or_none(
                f"{resources.deployments(s.namespace)}/{discovery.SKR_WEBHOOK_NAME}"
            )
        found = discovery.resolve(
            env_broker_url=s.broker_base,
            env_runtime_id=s.runtime_id,
            url_template=s.broker_url_template,
            configmap=configmap,
            skr_webhook=webhook,
            kyma_runtime_id=kyma.runtime_id if kyma else None,
        )
        if found.problems != self.discovery_problems:
            for problem in found.problems:
                log.warning("landscape source not used", extra={"problem": problem})
        self.discovery_problems = found.problems
        return found

    async def _application_connectors(self) -> list[str]:
        try:
            listing = await self._kube.list(
                resources.application_connectors(self._settings.namespace)
            )
        except NotFound:  # CRD not installed: the module is not there
            return []
        items = listing.items
        return sorted(
            f"{i.get('metadata', {}).get('name')}/{i.get('metadata', {}).get('generation')}"
            for i in items
            if not i.get("metadata", {}).get("deletionTimestamp")
        )

    def _about(self, kyma: KymaView | None) -> ObjectRef:
        s = self._settings
        if kyma is not None:
            return ObjectRef(
                api_version=resources.KYMA_GROUP_VERSION,
                kind="Kyma",
                name=s.kyma_name,
                namespace=s.namespace,
                uid=kyma.uid,
            )
        return ObjectRef(api_version="v1", kind="Secret", name=s.secret_name, namespace=s.namespace)

    async def _record(self, kyma: KymaView | None, reason: EventReason, message: str) -> None:
        await self._events.record(
            self._about(kyma), type_=event_type(reason), reason=str(reason), message=message
        )

    # -- the loop ------------------------------------------------------------------

    async def run(
        self,
        stop: asyncio.Event,
        *,
        leading: asyncio.Event | None = None,
        standby: asyncio.Event | None = None,
    ) -> None:
        """Turns until `stop`; with a lease, acts only while `leading` (`standby`: its inverse)."""
        failures = 0
        try:
            while not stop.is_set():
                if leading is not None and not leading.is_set():
                    await self._cancel_pull()
                    await self._cancel_report()
                    self._metrics.state.state("standby")
                    await _first(stop.wait(), leading.wait())
                    continue
                self._wake.clear()
                self.turns += 1
                try:
                    timeout = await self.turn()
                    failures = 0
                except KubeError as e:
                    failures += 1
                    timeout = next_delay(self._policy, failures, rng=self._rng)
                    log.warning(
                        "reconcile failed", extra={"error": str(e), "retry_in": round(timeout, 2)}
                    )
                waiters = [stop.wait(), self._wake.wait()]
                if standby is not None:
                    waiters.append(standby.wait())
                await _first(*waiters, wait_at_most=timeout)
        except BaseException:
            self.alive = False
            raise
        finally:
            await self._cancel_pull()
            await self._cancel_report()
            if self._background:
                await asyncio.wait(self._background, timeout=5)
                left = list(self._background)
                for task in left:
                    task.cancel()
                # Awaited, so no request is still half-open when the caller closes the client.
                await asyncio.gather(*left, return_exceptions=True)

    async def turn(self) -> float:
        """One reconcile: returns how long to sleep unless something triggers earlier."""
        gathered = await self.gather()
        observed = gathered.observed
        self._note_connection(observed, gathered.kyma)
        plan = decide.plan(observed, self._rules)
        if plan != self.last_plan:
            log.info(
                "plan",
                extra={
                    "action": str(plan.action),
                    "reason": str(plan.reason),
                    "until": plan.until and plan.until.isoformat(),
                },
            )
        self.last_plan = plan
        self._metrics.state.state(str(plan.reason))
        if plan.reason in (Reason.CONNECTION_HEALTHY, Reason.MODULE_DISABLED):
            self._pull_streak = 0
        waiting = await self._carry_out(plan, gathered)
        return min(waiting, await self._tend_reports(plan, gathered))

    async def _carry_out(self, plan: Plan, gathered: Gathered) -> float:
        """Does what the plan says; returns how long to sleep as far as the plan is concerned."""
        observed = gathered.observed
        asking = self._pull is not None and not self._pull.done()
        if asking and plan.action is not self._pull_action and not self._storing_token:
            log.info(
                "token request no longer needed, cancelling", extra={"reason": str(plan.reason)}
            )
            await self._cancel_pull()
            asking = False
        if plan.action in (Action.PULL, Action.RECHECK) and not asking:
            assert observed.runtime_id is not None
            self._pull_action = plan.action
            self._pull = asyncio.create_task(
                self._ask_for_token(
                    observed.runtime_id,
                    observed.fingerprint,
                    gathered.kyma,
                    once=plan.action is Action.RECHECK,
                ),
                name=f"compass-agent-{plan.action}",
            )
        elif plan.action is Action.NUDGE:
            return await self._nudge(observed)
        elif plan.action is Action.DELETE_SECRET:
            if await self._delete_secret(gathered.kyma):
                return 0.0  # look again at once: the deletion changes what we observe
            return self._policy.base
        if plan.action is Action.WAIT and plan.until is not None:
            return max((plan.until - observed.now).total_seconds(), 0.0)
        return self._settings.resync_period

    async def _tend_reports(self, plan: Plan, gathered: Gathered) -> float:
        """Starts a connection report when one is due; returns the seconds until the next one
        (infinite while one is in flight: its end wakes the loop)."""
        observed = gathered.observed
        if not decide.reporting_allowed(plan):
            await self._cancel_report()
            return NEVER
        if self._report is not None and not self._report.done():
            return NEVER
        report = connection_report.build_report(
            observed.connection, observed.secret, now=observed.now
        )
        due = connection_report.due_at(self._schedule, report.key, now=observed.now)
        if due > observed.now:
            return (due - observed.now).total_seconds()
        assert observed.runtime_id is not None  # reports are allowed only with a runtime ID
        self._report = asyncio.create_task(
            self._send_report(observed.runtime_id, report, gathered.kyma),
            name="compass-agent-report",
        )
        return NEVER

    def _note_connection(self, observed: Observed, kyma: KymaView | None) -> None:
        state = observed.connection.state if observed.connection else None
        previous, self._last_connection_state = self._last_connection_state, state
        if (
            state == ConnectionState.CONNECTION_FAILED
            and previous != state
            and observed.module_enabled
        ):
            error = observed.connection.error if observed.connection else None
            message = "CompassConnection is ConnectionFailed" + (f": {error}" if error else "")
            log.warning("connection failure seen", extra={"error": error})
            self._spawn_event(kyma, EventReason.CONNECTION_FAILURE_SEEN, message[:512])

    def _spawn_event(self, kyma: KymaView | None, reason: EventReason, message: str) -> None:
        # Best effort and off the loop's path; the recorder never raises.
        task = asyncio.create_task(self._record(kyma, reason, message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_pull(self) -> None:
        task, self._pull = self._pull, None
        await _cancelled(task)

    async def _cancel_report(self) -> None:
        task, self._report = self._report, None
        await _cancelled(task)

    # -- carrying out ----------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """Ready means "this agent can do its job": the loop runs, it knows where the broker
        is when it needs it, and the broker answers — a 503 while Compass is down is an answer
        with a stated reason (the agent backs off as told), no answer at all is not."""
        if not self.alive:
            return False, "the reconcile loop stopped"
        plan = self.last_plan
        if plan is None:
            return False, "no reconcile turn yet"
        if plan.reason is Reason.NO_BROKER_URL:
            problems = "; ".join(self.discovery_problems)
            return False, "broker URL unknown" + (f" ({problems})" if problems else "")
        if self._unreachable_streak >= UNREACHABLE_AFTER:
            return False, (
                f"no answer from the broker in {self._unreachable_streak} attempts "
                f"(last: {self._unanswered_reason})"
            )
        # Ready while revoked or refused: the agent works and does what the control plane told
        # it; the module going red would point the customer at the agent instead of at the
        # control plane. The reason says which.
        said = decide.readiness_reason(
            plan, revocation=self._revocation, report_refusal=self._report_refusal
        )
        return True, said

    def _count(self, outcome: Outcome) -> None:
        unanswered = isinstance(outcome, Temporary) and outcome.status is None
        self._unreachable_streak = self._unreachable_streak + 1 if unanswered else 0
        if isinstance(outcome, Temporary) and unanswered:
            self._unanswered_reason = outcome.detail or outcome.reason
        label = {Issued: "issued", Refused: "refused", Temporary: "temporary"}[type(outcome)]
        self._metrics.pull_attempts.labels(outcome=label).inc()

    async def _ask_for_token(
        self, runtime_id: str, print_: str, kyma: KymaView | None, *, once: bool
    ) -> None:
        """A pull (retried until a token or a refusal) or, while revoked, ONE request."""
        try:
            if once:
                log.info(
                    "asking whether the runtime is still revoked", extra={"runtime_id": runtime_id}
                )
                outcome = await self._broker.request_once(runtime_id)
                self._count(outcome)
            else:
                log.info("pulling a token", extra={"runtime_id": runtime_id})
                outcome = await self._broker.pull(runtime_id, on_attempt=self._count)
            # From here on the token is spent: a turn that plans otherwise (the spacing that
            # counts it already, the module disabled) must not cancel its write half-way.
            self._storing_token = isinstance(outcome, Issued)
            await self._settle(outcome, runtime_id, print_, kyma)
        except KubeError as e:
            # The token is lost with this failure; the next turn plans a new pull (spacing applies).
            log.error("could not write the token secret", extra={"error": str(e)})
        finally:
            self._storing_token = False
            self._wake.set()

    def _recheck_after(self) -> timedelta:
        return timedelta(seconds=jittered(self._settings.revoked_recheck_seconds, rng=self._rng))

    def _set_revocation(self, outcome: Outcome, kyma: KymaView | None) -> None:
        was = self._revocation
        self._revocation = decide.revocation_after(
            was, outcome, now=self._clock(), recheck_after=self._recheck_after()
        )
        self._metrics.revoked.set(0 if self._revocation is None else 1)
        if self._revocation is None:
            if was is not None:
                log.info("the runtime is no longer revoked in the control plane")
            return
        if not (isinstance(outcome, Refused) and outcome.revoked):
            log.info(
                "no answer while revoked, asking again later",
                extra={"recheck_at": self._revocation.recheck_at.isoformat()},
            )
            return
        # Reports start afresh once the runtime is back, so the control plane hears at once.
        self._schedule = connection_report.Schedule()
        detail = self._revocation.detail[:DETAIL_CHARS]
        log.warning(
            "the control plane revoked this runtime",
            extra={
                "reason": outcome.reason,
                "detail": detail,
                "recheck_at": self._revocation.recheck_at.isoformat(),
            },
        )
        self._spawn_event(
            kyma,
            EventReason.RUNTIME_REVOKED,
            f"the control plane revoked this runtime ({outcome.reason})"
            + (f": {detail}" if detail else "")
            + f"; asking again about every {self._settings.revoked_recheck_seconds:g} s; "
            f"{self._settings.secret_name} is kept",
        )

    async def _settle(
        self, outcome: Outcome, runtime_id: str, print_: str, kyma: KymaView | None
    ) -> None:
        self._set_revocation(outcome, kyma)
        if isinstance(outcome, Temporary) or (isinstance(outcome, Refused) and outcome.revoked):
            return
        if isinstance(outcome, Refused):
            self._refusal = Refusal(outcome.status, outcome.reason, self._clock(), print_)
            message = f"broker refused a token ({outcome.status} {outcome.reason})"
            if outcome.detail:
                message += f": {outcome.detail}"
            log.warning("pull refused", extra={"status": outcome.status, "reason": outcome.reason})
            await self._record(kyma, EventReason.PULL_REFUSED, message)
            return
        # Counted before writing: a token that cannot be stored (no RBAC, a webhook saying
        # no) was still spent, and the next pull must wait out the spacing — otherwise a
        # failing write would turn into a loop of tokens asked for and thrown away.
        self._refusal = None
        self._last_pull_at = self._clock()
        self._pull_streak += 1
        await self._write(outcome)
        self._metrics.last_success.set(self._clock().timestamp())
        log.info(
            "token written",
            extra={
                "runtime_id": runtime_id,
                "compass_runtime_id": outcome.compass_runtime_id,
                "expires_at": outcome.expires_at.isoformat(),
            },
        )
        await self._record(
            kyma,
            EventReason.TOKEN_PULLED,
            f"wrote a Compass one-time token for runtime {outcome.compass_runtime_id} "
            f"(expires {outcome.expires_at.isoformat()})",
        )

    async def _send_report(
        self, runtime_id: str, report: connection_report.ConnectionReport, kyma: KymaView | None
    ) -> None:
        try:
            outcome = await self._broker.report(runtime_id, report.body())
            self._metrics.reports.labels(outcome=_report_label(outcome)).inc()
            now = self._clock()
            if isinstance(outcome, Accepted):
                if self._report_refusal is not None:
                    log.info("the broker accepts connection reports again")
                    self._report_refusal = None
                if report.key != self._schedule.accepted:
                    log.info("connection reported", extra={"state": report.connection_state})
                self._schedule = connection_report.after_accepted(
                    report.key,
                    now=now,
                    interval=self._settings.report_interval_seconds,
                    broker_wish=outcome.next_report_after,
                    rng=self._rng,
                )
                return
            if isinstance(outcome, Refused) and outcome.revoked:
                self._set_revocation(outcome, kyma)
                return
            if isinstance(outcome, Refused):
                self._report_refused(outcome, kyma)
            self._report_failed(
                status=outcome.status,
                reason=outcome.reason,
                retry_after=outcome.retry_after if isinstance(outcome, Temporary) else None,
                detail=outcome.detail if isinstance(outcome, Temporary) else "",
            )
        except Exception as e:
            # Never expected; but without a backoff recorded the next turn would send at once.
            log.exception("connection report failed")
            self._report_failed(status=None, reason=type(e).__name__, retry_after=None)
        finally:
            self._wake.set()

    def _report_refused(self, outcome: Refused, kyma: KymaView | None) -> None:
        """Remembered for `/readyz`; told once per new refusal (a Warning Event)."""
        refusal = ReportRefusal(outcome.status, outcome.reason, outcome.detail[:DETAIL_CHARS])
        was, self._report_refusal = self._report_refusal, refusal
        if was is not None and (was.status, was.reason) == (refusal.status, refusal.reason):
            return
        slug = decide.problem_slug(refusal.reason)
        log.warning(
            "the broker refuses connection reports",
            extra={"status": refusal.status, "reason": slug, "detail": refusal.detail},
        )
        self._spawn_event(
            kyma,
            EventReason.REPORT_REFUSED,
            f"the broker refused a connection report ({refusal.status} {slug})"
            + (f": {refusal.detail}" if refusal.detail else ""),
        )

    def _report_failed(
        self,
        *,
        status: int | None,
        reason: str,
        retry_after: float | None,
        detail: str = "",
    ) -> None:
        now = self._clock()
        self._schedule = connection_report.after_failure(
            self._schedule, now=now, policy=self._policy, retry_after=retry_after, rng=self._rng
        )
        again_at = self._schedule.not_before or now
        log.info(
            "connection report not accepted, will retry",
            extra={
                "status": status,
                "reason": reason,
                **({"detail": detail} if detail else {}),
                "retry_in": round((again_at - now).total_seconds(), 2),
            },
        )

    async def _write(self, issued: Issued) -> None:
        s = self._settings
        # What the CompassConnection looks like now: a later lastSync means the token was tried.
        connection_raw = await self._kube.get_or_none(
            f"{resources.compass_connections()}/{resources.COMPASS_CONNECTION_NAME}"
        )
        seen = Connection.from_object(connection_raw).last_sync_text if connection_raw else ""
        desired = secret_io.desired_secret(
            namespace=s.namespace, name=s.secret_name, issued=issued, connection_seen=seen
        )
        for attempt in range(1, 6):
            try:
                await secret_io.write_secret(self._kube, desired)
                return
            except KubeUnavailable:
                if attempt == 5:
                    raise
                await asyncio.sleep(next_delay(self._policy, attempt, rng=self._rng))

    async def _nudge(self, observed: Observed) -> float:
        """Asks compass-runtime-agent to try the token now: it watches only its CompassConnection
        and otherwise waits for its resync (180 s in the module). Returns the sleep."""
        value = decide.handed_over_value(observed.secret) if observed.secret else None
        assert value is not None  # the plan nudges only for a token with an issue time
        path = f"{resources.compass_connections()}/{resources.COMPASS_CONNECTION_NAME}"
        try:
            await self._kube.merge_patch(
                path, {"metadata": {"annotations": {HANDED_OVER_ANNOTATION: value}}}
            )
        except KubeError as e:
            # Without the hand-over the token still gets tried at the next resync; the loop
            # asks again after its resync period, never in a hot loop.
            log.warning("could not hand the token over", extra={"error": str(e)})
            return self._settings.resync_period
        log.info("token handed over to compass-runtime-agent", extra={"issued_at": value})
        return 0.0  # look again at once: the annotation changes what we observe

    async def _delete_secret(self, kyma: KymaView | None) -> bool:
        s = self._settings
        deleted = await secret_io.delete_managed_secret(
            self._kube, namespace=s.namespace, name=s.secret_name
        )
        if deleted:
            log.info("module disabled, token secret removed", extra={"secret": s.secret_name})
            await self._record(
                kyma,
                EventReason.SECRET_REMOVED,
                f"application-connector module disabled: removed {s.namespace}/{s.secret_name}",
            )
        return deleted


def _report_label(outcome: ReportOutcome) -> str:
    if isinstance(outcome, Accepted):
        return "accepted"
    if isinstance(outcome, Refused):
        return "revoked" if outcome.revoked else "refused"
    return "rate-limited" if outcome.status == 429 else "failed"


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _first(*waiters: Coroutine[Any, Any, object], wait_at_most: float | None = None) -> None:
    """Waits until the first coroutine finishes (or `wait_at_most` seconds), cancelling the rest."""
    tasks = [asyncio.ensure_future(w) for w in waiters]
    try:
        await asyncio.wait(tasks, timeout=wait_at_most, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
