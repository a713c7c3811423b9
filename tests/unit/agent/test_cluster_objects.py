"""Parsing raw Kubernetes JSON into the agent's views, and the watched-input fingerprint."""

from __future__ import annotations

from datetime import UTC, datetime

from agent.cluster_objects import (
    COMPASS_RUNTIME_ID_ANNOTATION,
    EXPIRES_AT_ANNOTATION,
    ISSUED_AT_ANNOTATION,
    MANAGED_BY_LABEL,
    Connection,
    KymaView,
    TokenRecord,
    fingerprint,
    parse_time,
)

KYMA = {
    "metadata": {
        "uid": "u-1",
        "generation": 3,
        "labels": {"kyma-project.io/runtime-id": "rt-1", "other": "x"},
    },
    "spec": {"modules": [{"name": "istio"}, {"name": "application-connector"}]},
}


def test_kyma_module_and_runtime_id() -> None:
    view = KymaView.from_object(KYMA)
    assert view.module_in_spec
    assert view.runtime_id == "rt-1"
    assert view.generation == 3
    assert view.uid == "u-1"


def test_kyma_without_module_or_label() -> None:
    view = KymaView.from_object({"metadata": {}, "spec": {"modules": [{"name": "istio"}]}})
    assert not view.module_in_spec
    assert view.runtime_id is None


def test_kyma_odd_shapes_do_not_raise() -> None:
    for raw in ({}, {"spec": None}, {"spec": {"modules": "nope"}}, {"metadata": {"labels": None}}):
        view = KymaView.from_object(raw)
        assert not view.module_in_spec


def test_token_record_from_annotations() -> None:
    raw = {
        "metadata": {
            "labels": {MANAGED_BY_LABEL: "compass-agent"},
            "annotations": {
                EXPIRES_AT_ANNOTATION: "2025-01-01T13:00:00Z",
                ISSUED_AT_ANNOTATION: "2025-01-01T12:00:00Z",
                COMPASS_RUNTIME_ID_ANNOTATION: "c-1",
            },
        }
    }
    record = TokenRecord.from_secret(raw)
    assert record.managed
    assert record.expires_at == datetime(2025, 1, 1, 13, tzinfo=UTC)
    assert record.issued_at == datetime(2025, 1, 1, 12, tzinfo=UTC)
    assert record.compass_runtime_id == "c-1"
    assert not record.expired(datetime(2025, 1, 1, 12, 59, tzinfo=UTC))
    assert record.expired(datetime(2025, 1, 1, 13, tzinfo=UTC))


def test_foreign_secret_counts_as_unmanaged_and_expired() -> None:
    record = TokenRecord.from_secret({"metadata": {"labels": {MANAGED_BY_LABEL: "someone"}}})
    assert not record.managed
    assert record.expired(datetime(2000, 1, 1, tzinfo=UTC))


def test_connection_state_and_error() -> None:
    raw = {"status": {"connectionState": "ConnectionFailed", "connectionStatus": {"error": "boom"}}}
    connection = Connection.from_object(raw)
    assert connection.failed
    assert not connection.healthy
    assert connection.error == "boom"
    assert Connection.from_object({"status": {"connectionState": "Synchronized"}}).healthy
    assert Connection.from_object({}).state is None


def test_connection_certificate_expiry() -> None:
    status = {"connectionStatus": {"certificateStatus": {"notAfter": "2027-01-01T00:00:00Z"}}}
    connection = Connection.from_object({"status": status})
    assert connection.certificate_not_after == datetime(2027, 1, 1, tzinfo=UTC)
    for odd in (None, 5, "soon", {"notAfter": 1}):
        status = {"connectionStatus": {"certificateStatus": odd}}
        assert Connection.from_object({"status": status}).certificate_not_after is None


def test_parse_time_variants() -> None:
    assert parse_time("2025-01-01T00:00:00Z") == datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_time("2025-01-01T00:00:00.123456+00:00") is not None
    assert parse_time("2025-01-01T00:00:00") == datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_time("garbage") is None
    assert parse_time(None) is None
    assert parse_time("2025-01-01T01:00:00+01:00") == datetime(2025, 1, 1, tzinfo=UTC)
    # Valid RFC 3339, but not representable once shifted to UTC: unknown, not a crash.
    assert parse_time("0001-01-01T00:00:00+14:00") is None
    assert parse_time("9999-12-31T23:59:59-14:00") is None


def test_fingerprint_ignores_status_but_sees_spec_labels_and_signals() -> None:
    view = KymaView.from_object(KYMA)
    base = fingerprint(module_enabled=True, runtime_id="rt-1", kyma=view, application_connectors=[])
    with_status = KymaView.from_object({**KYMA, "status": {"state": "Ready"}})
    assert base == fingerprint(
        module_enabled=True, runtime_id="rt-1", kyma=with_status, application_connectors=[]
    )
    relabelled = KymaView.from_object(
        {**KYMA, "metadata": {**KYMA["metadata"], "labels": {"kyma-project.io/runtime-id": "rt-1"}}}
    )
    assert base != fingerprint(
        module_enabled=True, runtime_id="rt-1", kyma=relabelled, application_connectors=[]
    )
    assert base != fingerprint(
        module_enabled=True, runtime_id="rt-1", kyma=view, application_connectors=["ac/1"]
    )
    assert base != fingerprint(
        module_enabled=False, runtime_id="rt-1", kyma=view, application_connectors=[]
    )
