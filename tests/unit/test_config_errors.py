"""Settings that cannot work end in one line per problem naming the environment variable, exit 2,
no traceback, in both components; hostile values stay on their line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.settings import AgentSettings
from control_plane_broker.settings import (
    CredentialsInvalid,
    Settings,
    load_director_credentials,
    serving_problems,
)
from observability.config_errors import problem_lines
from tests.unit.entrypoints import run

HOSTILE = "x\n\x1b[31mred\r\u202eevil" + "y" * 300


def broker_errors(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    return problem_lines(caught.value, prefix="BROKER_")


def test_each_bad_broker_setting_is_one_line_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = broker_errors(
        monkeypatch,
        {
            "BROKER_IDENTITY_MODE": "oidc",
            "BROKER_PORT": HOSTILE,
            "BROKER_LOG_LEVEL": "loud",
            "BROKER_ALLOWED_SERVICE_ACCOUNTS": "kyma-system/compass-agent,oops",
        },
    )
    assert len(lines) == 4
    by_variable = {line.split(":", 1)[0]: line for line in lines}
    assert set(by_variable) == {
        "BROKER_IDENTITY_MODE",
        "BROKER_PORT",
        "BROKER_LOG_LEVEL",
        "BROKER_ALLOWED_SERVICE_ACCOUNTS",
    }
    assert "'tokenreview', 'jwks' or 'xfcc'" in by_variable["BROKER_IDENTITY_MODE"]
    assert "'oops' is not namespace/name" in by_variable["BROKER_ALLOWED_SERVICE_ACCOUNTS"]
    for line in lines:
        assert line.isprintable(), line  # no newline, escape or bidi character of the value
        assert len(line) < 200
        assert "identity_mode" not in line
        assert "errors.pydantic.dev" not in line


def test_a_rule_between_settings_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = broker_errors(monkeypatch, {"BROKER_REPORT_STALE_SECONDS": "10"})
    assert lines == [
        "BROKER_REPORT_STALE_SECONDS (10) must exceed BROKER_REPORT_REFRESH_SECONDS + "
        "BROKER_REPORT_INTERVAL_SECONDS (3900)"
    ]


def test_agent_settings_are_named_as_variables_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MODULE_SIGNALS", "kyma-spec,nope")
    monkeypatch.setenv("AGENT_BROKER_TIMEOUT", "-1")
    with pytest.raises(ValidationError) as caught:
        AgentSettings()
    assert problem_lines(caught.value, prefix="AGENT_") == [
        "AGENT_BROKER_TIMEOUT: Input should be greater than 0 (got '-1')",
        "AGENT_MODULE_SIGNALS (item 2): Input should be 'kyma-spec' or 'applicationconnector-cr' "
        "(got 'nope')",
    ]
    monkeypatch.delenv("AGENT_MODULE_SIGNALS")
    monkeypatch.delenv("AGENT_BROKER_TIMEOUT")
    monkeypatch.setenv("AGENT_IDENTITY_MODE", "mtls")
    with pytest.raises(ValidationError) as caught:
        AgentSettings()
    assert problem_lines(caught.value, prefix="AGENT_") == [
        "AGENT_IDENTITY_MODE=mtls needs AGENT_CLIENT_CERT_FILE and AGENT_CLIENT_KEY_FILE"
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "cannot be read (No such file or directory)"),
        ("data: [unclosed\n  client_secret: s3cret-value", "neither YAML nor JSON"),
        ("just text", "not a mapping"),
        ("data: 's3cret-value{'", "`data` is a string but not JSON"),
        ("data: {client_id: a}", "missing client_secret, tokens_endpoint"),
        (
            "data: {client_id: a, client_secret: s3cret-value, tokens_endpoint: 'file:///x'}",
            "tokens_endpoint is not an absolute http(s) URL",
        ),
        ("\udcff", "cannot be read"),
    ],
)
def test_a_credentials_file_that_cannot_be_used_says_why_without_its_secret(
    tmp_path: Path, text: str | None, said: str
) -> None:
    path = tmp_path / "credentials.yaml"
    if text == "\udcff":
        path.write_bytes(b"\xff\xfe\x00bad")
    elif text is not None:
        path.write_text(text)
    with pytest.raises(CredentialsInvalid) as caught:
        load_director_credentials(path)
    assert str(caught.value).startswith(f"{path}: {said}")
    assert "s3cret" not in str(caught.value)


def test_serving_needs_director_url_and_credentials(tmp_path: Path) -> None:
    assert [p.split(" ", 1)[0] for p in serving_problems(Settings())] == [
        "BROKER_DIRECTOR_URL",
        "BROKER_DIRECTOR_CREDENTIALS_FILE",
    ]
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    problems = serving_problems(
        Settings(
            director_url="compass/graphql",
            director_credentials_file=tmp_path / "none",
            issuer_ca_file=ca,
        )
    )
    assert problems[:2] == [
        "BROKER_DIRECTOR_URL: not an absolute http(s) URL (got 'compass/graphql')",
        f"BROKER_DIRECTOR_CREDENTIALS_FILE: {tmp_path / 'none'}: cannot be read "
        "(No such file or directory)",
    ]
    assert problems[2].startswith(f"BROKER_ISSUER_CA_FILE: {ca}: no PEM CA certificates can be")


def test_the_broker_process_says_every_problem_and_exits_2_without_a_traceback(
    tmp_path: Path,
) -> None:
    out = run(
        "control_plane_broker",
        {
            "BROKER_IDENTITY_MODE": HOSTILE,
            "BROKER_DIRECTOR_CREDENTIALS_FILE": str(tmp_path / "missing.yaml"),
        },
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert [line.split(":", 2)[1].strip().split(" ")[0] for line in lines] == [
        "BROKER_IDENTITY_MODE"
    ]  # a value that cannot be had stops before the rest is judged
    out = run(
        "control_plane_broker",
        {"BROKER_DIRECTOR_CREDENTIALS_FILE": str(tmp_path / "missing.yaml")},
        "--check-config",
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        "compass-broker: BROKER_DIRECTOR_URL is not set: Director's GraphQL endpoint, "
        "e.g. https://compass-gateway.example/director/graphql",
        f"compass-broker: BROKER_DIRECTOR_CREDENTIALS_FILE: {tmp_path / 'missing.yaml'}: "
        "cannot be read (No such file or directory)",
        "compass-broker: KUBECONFIG (unset: in-cluster access): not in a pod "
        "(KUBERNETES_SERVICE_HOST is unset) and no kubeconfig given",
    ]


def test_the_agent_process_says_every_problem_and_exits_2_without_a_traceback() -> None:
    out = run("agent", {"AGENT_LEASE_RENEW": "30", "AGENT_LOG_LEVEL": HOSTILE})
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("compass-agent: AGENT_LOG_LEVEL: must be one of DEBUG, INFO, ")
    out = run("agent", {"AGENT_LEASE_RENEW": "30"})
    assert out.stderr.splitlines() == [
        "compass-agent: AGENT_LEASE_RENEW must be shorter than AGENT_LEASE_DURATION"
    ]
    assert out.returncode == 2


def test_the_agents_help_names_variables_and_says_unset_not_none() -> None:
    out = run("agent", {}, "--help")
    assert out.returncode == 0
    assert "AGENT_RUNTIME_ID [unset]" in out.stdout
    assert "AGENT_DELETE_SECRET_ON_DISABLE [true]" in out.stdout
    assert "None" not in out.stdout


@pytest.mark.parametrize("value", ["0", "-5", "soon", HOSTILE])
def test_a_request_deadline_that_cannot_work_is_refused_by_name(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    [line] = broker_errors(monkeypatch, {"BROKER_REQUEST_DEADLINE_SECONDS": value})
    assert line.startswith("BROKER_REQUEST_DEADLINE_SECONDS: ")
    assert line.isprintable()
    assert len(line) < 200
