"""Revocation from the runtime's side: the real agent on a real runtime API server against a
broker that answers 403 `runtime-revoked` as the issue-13 contract says
(`contract_broker.ContractBroker`, HTTPS)."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise
from typing import Any

from tests.integration.agent.conftest import AgentEnv, eventually
from tests.integration.agent.contract_broker import (  # noqa: F401 - the fixture is found by name
    ContractBroker,
    broker_fixture,
    enabled_with_token,
    set_connection,
    sha256,
)

REASON = "decommissioned by ops (ticket 4711)"


def revoked_gauge(agent: Any) -> float:
    return float(agent.metrics.registry.get_sample_value("compass_agent_revoked") or 0.0)


def token_requests_in(broker: ContractBroker, start: float, end: float) -> list[float]:
    return [s.at for s in broker.tokens if start <= s.at <= end]


async def test_a_revoked_connected_runtime_stops_rechecks_slowly_and_comes_back(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    settings = agent_env.settings(
        broker.url,
        broker_ca_bundle=broker.ca_file,
        report_interval_seconds=1.0,
        revoked_recheck_seconds=3.0,
    )
    agent = await agent_env.start(settings)
    await enabled_with_token(agent_env)
    set_connection(agent_env, "Connected")
    await eventually(
        lambda: broker.accepted_reports(connectionState="Connected"), what="a Connected report"
    )
    assert revoked_gauge(agent) == 0

    # The operator revokes: the next heartbeat is answered 403 runtime-revoked.
    broker.revoked = REASON
    events = await eventually(
        lambda: agent_env.events("RuntimeRevoked"), within=10, what="a RuntimeRevoked event"
    )
    refused = next(s for s in broker.reports if s.status == 403)
    assert events[0].type == "Warning"
    assert REASON in events[0].message
    assert events[0].involved_object.kind == "Kyma"
    assert revoked_gauge(agent) == 1
    # Ready, with the reason in the body (the next loop turn plans on the revocation).
    await eventually(
        lambda: agent.ready() == (True, f"runtime-revoked: {REASON}"), what="ready, revoked"
    )

    # A bounded window of 10 s: re-checks every 3 s ± 20 % are 2 to 4 token requests, each at
    # least 2.4 s after the one before; no report at all.
    await asyncio.sleep(10.0)
    window_end = refused.at + 10.0
    rechecks = token_requests_in(broker, refused.at, window_end)
    assert 2 <= len(rechecks) <= 4, rechecks
    gaps = [b - a for a, b in pairwise([refused.at, *rechecks])]
    assert all(gap >= 2.3 for gap in gaps), gaps
    assert [s for s in broker.reports if s.at > refused.at] == []
    assert all(s.status == 403 for s in broker.tokens if s.at > refused.at)
    # The runtime's Compass connection is Compass's business: the secret stays.
    assert (agent_env.secret_data() or {}).get("TOKEN") == "ott-1"

    # Un-revoked: the next re-check gets a token, reports come back.
    broker.revoked = None
    await eventually(
        lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-2",
        within=8,
        what="a token from the next re-check",
    )
    await eventually(
        lambda: broker.accepted_reports(connectionState="Connected", tokenSha256=sha256("ott-2")),
        within=8,
        what="reports again",
    )
    assert revoked_gauge(agent) == 0
    assert agent.ready() == (True, "connection-healthy")


async def test_a_token_request_answered_runtime_revoked_is_asked_again_only_slowly(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    broker.revoked = REASON
    settings = agent_env.settings(
        broker.url,
        broker_ca_bundle=broker.ca_file,
        revoked_recheck_seconds=2.0,
        backoff_base=0.1,
        backoff_cap=0.5,
    )
    agent = await agent_env.start(settings)
    agent_env.put_kyma(modules=["application-connector"])
    events = await eventually(
        lambda: agent_env.events("RuntimeRevoked"), within=10, what="a RuntimeRevoked event"
    )
    assert REASON in events[0].message
    first = broker.tokens[0].at

    # A bounded window of 8 s: re-checks every 2 s ± 20 % are 3 to 6 token requests (the first
    # included), each at least 1.6 s after the one before.
    await asyncio.sleep(8.0 - (time.monotonic() - first))
    asked = token_requests_in(broker, first, first + 8.0)
    assert 3 <= len(asked) <= 6, asked
    gaps = [b - a for a, b in pairwise(asked)]
    assert all(gap >= 1.5 for gap in gaps), gaps
    # The report that started with the first pull may have landed; none after that.
    assert len(broker.reports) <= 1
    assert agent_env.secret() is None
    assert revoked_gauge(agent) == 1
    assert agent.ready() == (True, f"runtime-revoked: {REASON}")

    broker.revoked = None
    await eventually(
        lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-1",
        within=6,
        what="the token once no longer revoked",
    )
    assert revoked_gauge(agent) == 0
