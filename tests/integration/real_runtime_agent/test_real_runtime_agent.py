"""Our agent's secret, read by Kyma's real compass-runtime-agent: first connection, a spent token,
the secret deleted, the module disabled — one Director token per (re)connect, `Synchronized` at
the end, and our agent's reports of each state."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from devenv.runtime_agent import RealRuntimeAgent
from tests.integration.real_runtime_agent.conftest import Landscape
from tests.integration.waiting import eventually

# Short enough for a test, long enough that only the hand-over explains a prompt try: the real
# agent otherwise acts at its resync only (the module's 180 s), never on a Secret change.
SYNC_PERIOD = 40.0
MINIMAL_SYNC = 15.0  # the module's APP_MINIMAL_COMPASS_SYNC_TIME
# Connected -> Synchronized takes the next reconcile after the minimal sync time: a resync.
SYNCED_WITHIN = 2 * SYNC_PERIOD + 30

pytestmark = pytest.mark.timeout(900)


async def test_the_real_runtime_agent_connects_once_per_token_and_synchronizes(
    landscape: Landscape, runtime_agent_dir: Path, tmp_path: Path
) -> None:
    env = landscape.env
    settings = env.settings(
        landscape.broker.url,
        handover_grace=600.0,  # only the observed try may replace a token
        connection_grace=600.0,
        runtime_agent_min_sync=MINIMAL_SYNC + 1,
        report_interval_seconds=3600.0,
    )
    real = RealRuntimeAgent(
        env.cluster,
        runtime_agent_dir,
        tmp_path / "runtime-agent",
        sync_period=SYNC_PERIOD,
        minimal_sync=MINIMAL_SYNC,
    )
    with real:
        await env.start(settings)
        # Before the module is enabled there is no secret: the real agent fails for that.
        await eventually(lambda: landscape.state() == "ConnectionFailed", within=60, what="failed")
        assert landscape.tokens_issued() == 0

        # 1. first connection: module enabled -> one token -> handed over -> Synchronized
        enabled = time.monotonic()
        env.put_kyma(modules=["application-connector"])
        await eventually(lambda: landscape.state() == "Connected", within=60, what="Connected")
        connected_after = time.monotonic() - enabled
        # Well before the real agent's resync: the hand-over made it try.
        assert connected_after < SYNC_PERIOD * 0.9 + 5, real.log_tail()
        await eventually(
            lambda: landscape.state() == "Synchronized", within=SYNCED_WITHIN, what="Synchronized"
        )
        assert landscape.tokens_issued() == 1
        connection = landscape.connection()
        assert connection is not None
        assert connection["spec"]["managementInfo"]["connectorUrl"] == (
            f"{landscape.secured.url}/connector/graphql"
        )
        await eventually(
            lambda: "Synchronized" in landscape.reported_states(), within=30, what="report"
        )

        # 2. spent token: the real agent starts over (its CompassConnection deleted) and fails
        # with the used token; our agent pulls exactly one fresh token, and it is used.
        env.delete_connection()
        await eventually(lambda: landscape.state() == "ConnectionFailed", within=60, what="spent")
        failed_at = time.monotonic()
        error = (landscape.connection() or {})["status"]["connectionStatus"]["error"]
        assert error
        await eventually(
            lambda: "ConnectionFailed" in landscape.reported_states(), within=30, what="report"
        )
        await eventually(
            lambda: landscape.state() == "Synchronized", within=SYNCED_WITHIN, what="resynced"
        )
        assert landscape.tokens_issued() == 2, real.log_tail()
        recovered_after = time.monotonic() - failed_at
        assert recovered_after < SYNCED_WITHIN

        # 3. secret deleted: one new token; the real agent stays (or comes back) Synchronized
        issued = landscape.tokens_issued()
        env.cluster.core.delete_namespaced_secret("compass-agent-configuration", env.namespace)
        await eventually(lambda: env.secret_data() is not None, within=30, what="secret back")
        await eventually(
            lambda: landscape.tokens_issued() == issued + 1, within=10, what="one token"
        )
        await eventually(
            lambda: landscape.state() == "Synchronized", within=SYNCED_WITHIN, what="still synced"
        )
        assert landscape.tokens_issued() == issued + 1

        # Our agent has reported what it knows since: the new token's digest is in a report
        # (a report of step 3 arriving after the count below would look like one of step 4).
        token = (env.secret_data() or {})["TOKEN"]
        digest = hashlib.sha256(token.encode()).hexdigest()
        await eventually(
            lambda: any(b.get("tokenSha256") == digest for b in landscape.broker.report_bodies),
            within=30,
            what="the new token reported",
        )
        await asyncio.sleep(1)  # a report already on its way lands before the count

        # 4. module disabled: the secret goes, the real agent's next sync fails for want of it,
        # our agent reports nothing more (disabled) and asks for no token.
        reports = len(landscape.broker.report_bodies)
        env.put_kyma(modules=[])
        await eventually(lambda: env.secret_data() is None, within=30, what="secret removed")
        await eventually(
            lambda: landscape.state() == "SynchronizationFailed",
            within=SYNCED_WITHIN,
            what="sync fails without the secret",
        )
        assert landscape.tokens_issued() == issued + 1
        assert len(landscape.broker.report_bodies) == reports
        assert real.running, real.log_tail()
