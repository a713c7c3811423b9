"""The pure pieces of the compass-runtime-agent stand-in: when it acts (resync clock, jitter,
the minimal-sync rate limit, requeue backoff), when it renews, and the states it writes — each
as the real agent (application-connector-manager 859cac3) does it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devenv.runtime_agent_sim import (
    IssuedCertificate,
    ResyncClock,
    build_parser,
    format_time,
    jittered,
    new_connection,
    parse_time,
    requeue_delay,
    set_connected,
    set_connection_failed,
    set_maintenance_failed,
    set_sync_failed,
    set_synchronized,
    should_renew,
    sim_from_args,
    skip_application_sync,
    skip_connection_sync,
)

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def test_the_period_is_jittered_by_0_9_to_1_1() -> None:
    assert jittered(180, 0.0) == pytest.approx(162)
    assert jittered(180, 0.5) == pytest.approx(180)
    assert jittered(180, 0.999999) == pytest.approx(198, abs=1e-3)


def test_the_first_resync_comes_two_periods_after_start_then_every_period() -> None:
    clock = ResyncClock(10.0, start=0.0)
    resyncs = []
    now = 0.0
    while now < 50:
        now = clock.next_tick
        if clock.tick(now):
            resyncs.append(round(now))
    assert resyncs == [20, 30, 40, 50]


def connection(**status: Any) -> dict[str, Any]:
    found = new_connection()
    found["status"].update(status)
    return found


def test_nothing_happens_while_last_sync_is_younger_than_the_minimal_sync_time() -> None:
    fresh = connection(connectionStatus={"lastSync": format_time(NOW - timedelta(seconds=14))})
    old = connection(connectionStatus={"lastSync": format_time(NOW - timedelta(seconds=15))})
    assert skip_connection_sync(fresh, NOW, 15)
    assert not skip_connection_sync(old, NOW, 15)
    # No connection status yet (a CompassConnection just made), or resyncNow: never skipped.
    assert not skip_connection_sync(connection(), NOW, 15)
    fresh["spec"]["resyncNow"] = True
    assert not skip_connection_sync(fresh, NOW, 15)
    # Whole seconds, as Go's int64(minimal.Seconds()): a minimal time under 1 s never skips.
    assert not skip_connection_sync(old, NOW, 0.3)


def test_the_director_sync_has_its_own_rate_limit_on_last_attempt() -> None:
    recent = connection(synchronizationStatus={"lastAttempt": format_time(NOW)})
    assert skip_application_sync(recent, NOW, 15)
    assert not skip_application_sync(connection(), NOW, 15)
    assert not skip_application_sync(recent, NOW + timedelta(seconds=15), 15)


def issued(days: int = 90) -> IssuedCertificate:
    return IssuedCertificate(
        client_pem=b"",
        chain_pem=b"",
        ca_pem=b"",
        key_pem=b"",
        subject="CN=x",
        not_before=NOW,
        not_after=NOW + timedelta(days=days),
        director_url="https://mtls/director/graphql",
        secured_connector_url="https://mtls/connector/graphql",
    )


def test_connected_sets_management_info_from_the_connector_and_a_fresh_status() -> None:
    found = new_connection()
    set_connection_failed(found, NOW, "Failed to retrieve certificate: token was already used")
    assert found["status"]["connectionState"] == "ConnectionFailed"
    assert found["status"]["connectionStatus"]["lastSync"] == "2026-12-06T12:00:00Z"
    assert found["status"]["connectionStatus"]["established"] is None  # Go's zero time
    set_connected(found, NOW, issued())
    assert found["spec"]["managementInfo"] == {
        "directorUrl": "https://mtls/director/graphql",
        "connectorUrl": "https://mtls/connector/graphql",
    }
    status = found["status"]["connectionStatus"]
    assert found["status"]["connectionState"] == "Connected"
    assert "error" not in status  # a new ConnectionStatus: the failure's message is gone
    assert status["certificateStatus"]["notAfter"] == format_time(NOW + timedelta(days=90))


def test_failure_states_keep_what_the_real_agent_keeps() -> None:
    found = new_connection()
    set_connected(found, NOW, issued())
    set_maintenance_failed(found, NOW, "Error while trying to maintain connection: x")
    assert found["status"]["connectionState"] == "ConnectionMaintenanceFailed"
    assert found["status"]["connectionStatus"]["established"] == format_time(NOW)
    set_synchronized(found, NOW)
    assert found["status"]["connectionState"] == "Synchronized"
    # Go leaves the maintenance error in connectionStatus after a later success.
    assert found["status"]["connectionStatus"]["error"].startswith("Error while")
    set_sync_failed(found, NOW, "Failed to read Runtime config: not found")
    sync = found["status"]["synchronizationStatus"]
    assert found["status"]["connectionState"] == "SynchronizationFailed"
    assert sync["lastSuccessfulApplication"] == format_time(NOW)  # kept from the success
    assert sync["error"] == "Failed to read Runtime config: not found"


def test_renewal_when_little_validity_is_left_or_asked_for() -> None:
    found = new_connection()
    set_connected(found, NOW, issued(days=90))
    assert not should_renew(found, NOW, threshold=0.3, minimal=15)
    assert should_renew(found, NOW + timedelta(days=64), threshold=0.3, minimal=15)
    found["spec"]["refreshCredentialsNow"] = True
    assert should_renew(found, NOW, threshold=0.3, minimal=15)


def test_requeue_backoff_doubles_from_5_ms_to_1000_s() -> None:
    assert [requeue_delay(n) for n in (1, 2, 3)] == [0.005, 0.01, 0.02]
    assert requeue_delay(40) == 1000.0


def test_times_read_as_go_writes_them() -> None:
    assert parse_time("2026-12-06T12:00:00Z") == NOW
    assert parse_time(None) is None
    assert parse_time("garbage") is None


def test_the_earlier_interval_option_still_works(tmp_path: Any) -> None:
    args = build_parser().parse_args(["--kubeconfig", "k", "--interval", "0.3"])
    sim = sim_from_args(object(), args)  # type: ignore[arg-type]
    assert sim.timing.sync_period == 0.3
    assert sim.timing.minimal_sync == 1.0  # under 1 s every own update would retry at once
    assert sim.names.ca_secret == "kyma-system/kyma-gateway-certs-cacert"
    new = sim_from_args(object(), build_parser().parse_args(["--kubeconfig", "k"]))  # type: ignore[arg-type]
    assert (new.timing.sync_period, new.timing.minimal_sync) == (180.0, 15.0)
    assert new.names.ca_secret == "istio-system/kyma-gateway-certs-cacert"
    assert 162 <= new.period < 198
