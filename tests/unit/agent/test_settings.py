"""The settings object: environment names, list parsing and the checks it enforces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.settings import AgentSettings, IdentityMode, ModuleSignal


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENT_"):
            monkeypatch.delenv(name)


def test_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_BROKER_URL", "https://broker.kcp.example/")
    settings = AgentSettings()
    assert settings.broker_base == "https://broker.kcp.example"
    assert settings.namespace == "kyma-system"
    assert settings.secret_name == "compass-agent-configuration"
    assert settings.refusal_cadence == 600
    assert settings.backoff_cap == 300
    assert settings.delete_secret_on_disable
    assert settings.identity_mode is IdentityMode.SERVICEACCOUNT
    assert settings.module_signals == [ModuleSignal.KYMA_SPEC, ModuleSignal.APPLICATIONCONNECTOR_CR]
    assert settings.retry_policy.cap == 300
    assert settings.report_interval_seconds == 300
    assert settings.revoked_recheck_seconds == 600


def test_report_and_recheck_periods_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_BROKER_URL", "https://b")
    monkeypatch.setenv("AGENT_REPORT_INTERVAL_SECONDS", "120")
    monkeypatch.setenv("AGENT_REVOKED_RECHECK_SECONDS", "1800")
    settings = AgentSettings()
    assert settings.report_interval_seconds == 120
    assert settings.revoked_recheck_seconds == 1800


def test_comma_separated_signals_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_BROKER_URL", "https://b")
    monkeypatch.setenv("AGENT_MODULE_SIGNALS", "applicationconnector-cr")
    monkeypatch.setenv("AGENT_DELETE_SECRET_ON_DISABLE", "false")
    monkeypatch.setenv("AGENT_RUNTIME_ID", "byoc-1")
    settings = AgentSettings()
    assert settings.module_signals == [ModuleSignal.APPLICATIONCONNECTOR_CR]
    assert not settings.delete_secret_on_disable
    assert settings.runtime_id == "byoc-1"


@pytest.mark.parametrize(
    "changes",
    [
        {"identity_mode": "mtls"},  # no certificate files
        {"module_signals": "nonsense"},
        {"module_signals": ""},
        {"lease_renew": 20.0, "lease_duration": 15.0},
        {"backoff_cap": 0},
        {"report_interval_seconds": 0},
        {"revoked_recheck_seconds": -1},
        {"broker_url": "not a url"},
    ],
)
def test_invalid_settings_are_rejected(changes: dict[str, object]) -> None:
    values: dict[str, object] = {"broker_url": "https://b", **changes}
    with pytest.raises(ValidationError):
        AgentSettings(**values)  # type: ignore[arg-type]


def test_mtls_with_files_is_accepted(tmp_path: Path) -> None:
    settings = AgentSettings(
        broker_url="https://b",  # type: ignore[arg-type]
        identity_mode=IdentityMode.MTLS,
        client_cert_file=tmp_path / "tls.crt",
        client_key_file=tmp_path / "tls.key",
    )
    assert settings.identity_mode is IdentityMode.MTLS
