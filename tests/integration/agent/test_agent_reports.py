"""Connection reports: the real agent on a real runtime API server (a real CompassConnection from
the published CRD) reports to a broker that answers as the issue-13 contract says
(`contract_broker.ContractBroker`, HTTPS)."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise

import pytest

from tests.integration.agent.conftest import AgentEnv, eventually
from tests.integration.agent.contract_broker import (  # noqa: F401 - the fixture is found by name
    EXPECTED_AUTHORIZATION,
    ContractBroker,
    broker_fixture,
    enabled_with_token,
    reports_total,
    set_connection,
    sha256,
)


async def test_a_changed_connection_state_is_reported_at_once(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    settings = agent_env.settings(
        broker.url,
        broker_ca_bundle=broker.ca_file,
        report_interval_seconds=3600.0,
        handover_grace=600.0,  # the token stays while the test fails the connection
    )
    agent = await agent_env.start(settings)
    await enabled_with_token(agent_env)
    # Before any CompassConnection: NotFound, first without and then with the token's hash.
    first = await eventually(broker.accepted_reports, what="a first report")
    assert first[0].body is not None
    assert first[0].body["connectionState"] == "NotFound"
    await eventually(
        lambda: broker.accepted_reports(connectionState="NotFound", tokenSha256=sha256("ott-1")),
        what="NotFound with the token's hash",
    )

    set_connection(agent_env, "Connected", not_after="2027-01-01T01:00:00+01:00")
    connected = await eventually(
        lambda: broker.accepted_reports(
            connectionState="Connected", certificateNotAfter="2027-01-01T00:00:00.000Z"
        ),
        what="a Connected report with the certificate's expiry",
    )
    body = connected[0].body
    assert body is not None
    assert body["tokenSha256"] == sha256("ott-1")
    assert "lastError" not in body
    assert set(body) == {"connectionState", "certificateNotAfter", "tokenSha256", "observedAt"}

    changed_at = time.monotonic()
    set_connection(
        agent_env,
        "ConnectionFailed",
        error="x509: certificate has expired",
        not_after="2027-01-01T01:00:00+01:00",
    )
    failed = await eventually(
        lambda: broker.accepted_reports(
            connectionState="ConnectionFailed", lastError="x509: certificate has expired"
        ),
        what="a ConnectionFailed report with the error",
    )
    # A change does not wait for the (hour-long) heartbeat.
    assert failed[0].at - changed_at < 5

    assert all(s.authorization == EXPECTED_AUTHORIZATION for s in broker.seen)
    assert all(s.runtime_id == agent_env.runtime_id for s in broker.seen)
    assert all("ott-1" not in str(s.body) for s in broker.reports)  # a hash, never the token
    assert all(s.status == 202 for s in broker.reports)  # every body passed the contract's check
    # The broker records a report before the agent has read its answer: counted a moment later.
    await eventually(
        lambda: reports_total(agent, "accepted") == len(broker.reports),
        what="every accepted report counted",
    )


@pytest.mark.parametrize(
    ("own", "wish"),
    [(2.0, 3600), (3600.0, 2)],
    ids=["own interval shorter", "broker's wish shorter"],
)
async def test_heartbeat_repeats_an_unchanged_state_at_the_shorter_period_with_jitter(
    agent_env: AgentEnv, broker: ContractBroker, own: float, wish: int
) -> None:
    broker.next_report_after = wish
    settings = agent_env.settings(
        broker.url, broker_ca_bundle=broker.ca_file, report_interval_seconds=own
    )
    await agent_env.start(settings)
    await enabled_with_token(agent_env)
    set_connection(agent_env, "Connected", not_after="2027-01-01T00:00:00Z")
    steady = {
        "connectionState": "Connected",
        "certificateNotAfter": "2027-01-01T00:00:00.000Z",
        "tokenSha256": sha256("ott-1"),
    }
    beats = await eventually(
        lambda: len(broker.accepted_reports(**steady)) >= 5 and broker.accepted_reports(**steady),
        within=20,
        what="five reports of the same state",
    )
    between = [b.at - a.at for a, b in pairwise(beats[:5])]
    # 2 s ± 20 %, plus the time a loop turn and a request take on a busy machine.
    assert all(1.5 <= gap <= 3.5 for gap in between), between


async def test_rate_limited_reports_honour_retry_after_and_never_delay_the_token(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    broker.rate_limited_reports = 2
    broker.retry_after = "2"
    # The agent's own backoff would come back within 0.5 s; the broker asked for 2 s.
    settings = agent_env.settings(
        broker.url, broker_ca_bundle=broker.ca_file, backoff_base=0.1, backoff_cap=0.5
    )
    agent = await agent_env.start(settings)
    enabled_at = time.monotonic()
    await enabled_with_token(agent_env)
    written_after = time.monotonic() - enabled_at
    await eventually(broker.accepted_reports, within=15, what="an accepted report")
    times = [s.at for s in broker.reports[:3]]
    assert [s.status for s in broker.reports[:3]] == [429, 429, 202]
    assert all(gap >= 1.9 for gap in (b - a for a, b in pairwise(times))), times
    # The token was written while the reports were still being turned away.
    assert written_after < times[2] - enabled_at
    assert reports_total(agent, "rate-limited") == 2


async def test_a_hanging_report_does_not_delay_the_token(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    broker.hold_reports = asyncio.Event()
    await agent_env.start(agent_env.settings(broker.url, broker_ca_bundle=broker.ca_file))
    agent_env.put_kyma(modules=["application-connector"])
    await eventually(lambda: broker.reports, what="a report on its way")
    await eventually(agent_env.secret_data, within=5, what="the token while the report hangs")
    assert all(s.status == 0 for s in broker.reports)  # still unanswered
    assert len(broker.reports) == 1  # one report in flight at a time


async def test_an_odd_compass_connection_is_reported_within_the_contract(
    agent_env: AgentEnv, broker: ContractBroker
) -> None:
    await agent_env.start(agent_env.settings(broker.url, broker_ca_bundle=broker.ca_file))
    await enabled_with_token(agent_env)
    # The published CRD accepts any string: an unknown state and a 200,000-character error,
    # mostly four-byte characters, with control characters in it.
    set_connection(agent_env, "Reticulating", error="\x1b[31m" + "😀" * 50_000 + "x" * 50_000)
    reported = await eventually(
        lambda: [
            s for s in broker.reports if s.body and s.body.get("lastError", "").startswith(" ")
        ],
        what="the odd state reported",
    )
    body = reported[0].body
    assert reported[0].status == 202  # the contract broker's strict check let it through
    assert body is not None
    assert body["connectionState"] == "NotFound"
    assert 0 < len(body["lastError"]) <= 1024
    assert all(s.status == 202 for s in broker.reports)
    # And the agent carries on: a real state afterwards is reported as usual.
    set_connection(agent_env, "Connected")
    await eventually(
        lambda: broker.accepted_reports(connectionState="Connected", tokenSha256=sha256("ott-1")),
        what="Connected after the odd state",
    )
