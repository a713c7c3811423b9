"""Every numeric setting of both components has its bounds on its field, and only there: a value
outside them (the issue's list, and the whole class: each setting just below its minimum and just
above its maximum) stops the process with exit 2 and one line naming the variable, never a
traceback, at `--check-config` and at start; the charts' values schemas hold the same bounds
for every value the charts turn into one of these variables."""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import annotated_types as at
import pytest
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

import agent.__main__ as agent_main
import control_plane_broker.__main__ as broker_main
from agent.settings import AgentSettings
from control_plane_broker.settings import Settings
from tests.conftest import REPO_ROOT
from tests.unit.entrypoints import run

COMPONENTS: dict[str, tuple[type[BaseSettings], Any, str]] = {
    "broker": (Settings, broker_main, "BROKER_"),
    "agent": (AgentSettings, agent_main, "AGENT_"),
}
PROG = {"broker": "compass-broker", "agent": "compass-agent"}


def bounds(field: FieldInfo) -> dict[str, float]:
    """The field's declared bounds, named as JSON Schema names them."""
    found: dict[str, float] = {}
    for item in field.metadata:
        if isinstance(item, at.Ge):
            found["minimum"] = float(item.ge)  # type: ignore[arg-type]
        elif isinstance(item, at.Gt):
            found["exclusiveMinimum"] = float(item.gt)  # type: ignore[arg-type]
        elif isinstance(item, at.Le):
            found["maximum"] = float(item.le)  # type: ignore[arg-type]
        elif isinstance(item, at.Lt):
            found["exclusiveMaximum"] = float(item.lt)  # type: ignore[arg-type]
    return found


def numeric_fields(model: type[BaseSettings]) -> dict[str, FieldInfo]:
    return {n: f for n, f in model.model_fields.items() if f.annotation in (int, float)}


def out_of_bounds(field: FieldInfo) -> Iterator[tuple[str, str]]:
    """(which side, value) just outside each bound: one step for an int, a little for a float."""
    step = 1.0 if field.annotation is int else 0.001
    b = bounds(field)
    if "minimum" in b:
        yield "below", str(b["minimum"] - step)
    if "exclusiveMinimum" in b:
        yield "below", str(b["exclusiveMinimum"])
    if "maximum" in b:
        yield "above", str(b["maximum"] + step)
    if "exclusiveMaximum" in b:
        yield "above", str(b["exclusiveMaximum"])
    if field.annotation is float:
        yield "not a number", "nan"


def string_rules(field: FieldInfo) -> dict[str, object]:
    """A string field's declared form, named as JSON Schema names it."""
    rules: dict[str, object] = {}
    for item in field.metadata:
        if isinstance(item, at.MinLen):
            rules["minLength"] = item.min_length
        elif isinstance(item, at.MaxLen):
            rules["maxLength"] = item.max_length
        elif (pattern := getattr(item, "pattern", None)) is not None:
            rules["pattern"] = pattern
    return rules


def cases() -> Iterator[Any]:
    for component, (model, _, prefix) in COMPONENTS.items():
        for name, field in numeric_fields(model).items():
            for side, value in out_of_bounds(field):
                text = value.removesuffix(".0") if field.annotation is int else value
                variable = f"{prefix}{name.upper()}"
                yield pytest.param(component, variable, text, id=f"{variable}-{side}")
        for name, field in model.model_fields.items():
            rules = string_rules(field)
            variable = f"{prefix}{name.upper()}"
            if "pattern" in rules:
                yield pytest.param(component, variable, "Not/A_Name", id=f"{variable}-form")
            if "maxLength" in rules:
                long = "a" * (int(str(rules["maxLength"])) + 1)
                yield pytest.param(component, variable, long, id=f"{variable}-too-long")
            if "minLength" in rules:
                yield pytest.param(component, variable, "", id=f"{variable}-empty")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("BROKER_", "AGENT_")) or name == "KUBECONFIG":
            monkeypatch.delenv(name)


def test_every_numeric_setting_has_a_minimum_and_a_maximum() -> None:
    for model, _, prefix in COMPONENTS.values():
        fields = numeric_fields(model)
        assert len(fields) >= 10  # the test below is not vacuous
        for name, field in fields.items():
            b = bounds(field)
            assert b.keys() & {"minimum", "exclusiveMinimum"}, f"{prefix}{name.upper()}"
            assert b.keys() & {"maximum", "exclusiveMaximum"}, f"{prefix}{name.upper()}"


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(("component", "variable", "value"), list(cases()))
@pytest.mark.parametrize("argv", [["--check-config"], []], ids=["check-config", "start"])
def test_a_value_out_of_bounds_exits_2_with_one_line_naming_it(
    component: str,
    variable: str,
    value: str,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, main_module, _ = COMPONENTS[component]
    monkeypatch.setenv(variable, value)
    assert main_module.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"{PROG[component]}: {variable}: "), line


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("component", list(COMPONENTS))
def test_a_value_on_its_bound_is_accepted(component: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds are where the tests above say: each value on a bound passes its own check
    (a rule between settings may still refuse it, naming both variables in its own words)."""
    model, _, prefix = COMPONENTS[component]
    for name, field in numeric_fields(model).items():
        for bound, value in bounds(field).items():
            if bound.startswith("exclusive"):
                continue
            text = str(int(value)) if field.annotation is int else str(value)
            variable = f"{prefix}{name.upper()}"
            monkeypatch.setenv(variable, text)
            try:
                model()
            except ValueError as exc:
                refused = str(exc)
            else:
                refused = ""
            assert f"{name}\n" not in refused, f"{variable}={text}: {refused}"
            monkeypatch.delenv(variable)


def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return path


ISSUE_37 = [
    ("control_plane_broker", {"BROKER_PORT": "70000"}, "BROKER_PORT: "),
    (
        "control_plane_broker",
        {"BROKER_LEASE_RENEW_SECONDS": "20", "BROKER_LEASE_DURATION_SECONDS": "15"},
        "BROKER_LEASE_RENEW_SECONDS (20) must be shorter than BROKER_LEASE_DURATION_SECONDS (15)",
    ),
    ("control_plane_broker", {"BROKER_DIRECTOR_TIMEOUT_SECONDS": "-5"}, "BROKER_DIRECTOR_TIMEOUT"),
    ("control_plane_broker", {"BROKER_DIRECTOR_MAX_CONCURRENCY": "0"}, "BROKER_DIRECTOR_MAX_"),
    ("control_plane_broker", {"BROKER_RATE_LIMIT_BURST": "0"}, "BROKER_RATE_LIMIT_BURST: "),
    ("control_plane_broker", {"BROKER_RATE_LIMIT_PER_MINUTE": "-1"}, "BROKER_RATE_LIMIT_PER_"),
    ("control_plane_broker", {"BROKER_BREAKER_FAILURE_THRESHOLD": "0"}, "BROKER_BREAKER_FAIL"),
    ("control_plane_broker", {"BROKER_SWEEP_INTERVAL_SECONDS": "-1"}, "BROKER_SWEEP_INTERVAL"),
    ("control_plane_broker", {"BROKER_HOST": "nope"}, "BROKER_HOST: "),
    ("agent", {"AGENT_HEALTH_ADDRESS": "nope"}, "AGENT_HEALTH_ADDRESS: must be host:port"),
    ("agent", {"AGENT_HEALTH_ADDRESS": "127.0.0.1:99999"}, "AGENT_HEALTH_ADDRESS: the port"),
    ("agent", {"AGENT_HEALTH_ADDRESS": "example.com:80"}, "AGENT_HEALTH_ADDRESS: the host"),
    ("agent", {"AGENT_BROKER_CA_BUNDLE": "/nonexistent"}, "AGENT_BROKER_CA_BUNDLE: /nonexistent"),
]


@pytest.mark.parametrize(("module", "env", "said"), ISSUE_37, ids=[str(e) for _, e, _ in ISSUE_37])
@pytest.mark.parametrize("args", [("--check-config",), ()], ids=["check-config", "start"])
def test_the_values_of_issue_37_exit_2_with_one_line_as_processes(
    module: str, env: dict[str, str], said: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    # Everything else the processes need is there, so the line is the value's and no other's.
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(
        "data: {client_id: a, client_secret: s, tokens_endpoint: 'https://oauth.test/token'}"
    )
    given = {
        "KUBECONFIG": str(kubeconfig(tmp_path)),
        "AGENT_KUBECONFIG": str(kubeconfig(tmp_path)),
        "BROKER_DIRECTOR_URL": "https://director.test/graphql",
        "BROKER_DIRECTOR_CREDENTIALS_FILE": str(credentials),
        **env,
    }
    out = run(module, given, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    prog = "compass-agent" if module == "agent" else "compass-broker"
    [line] = out.stderr.splitlines()
    assert line.startswith(f"{prog}: {said}"), line


@pytest.mark.usefixtures("clean_env")
def test_the_agent_checks_its_config_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENT_KUBECONFIG", str(kubeconfig(tmp_path)))
    monkeypatch.setenv("AGENT_HEALTH_ADDRESS", "127.0.0.1:0")
    assert agent_main.main(["--check-config"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (
        "compass-agent: ok: settings (AGENT_*) valid, files readable, kubeconfig usable\n",
        "",
    )
    monkeypatch.setenv("AGENT_BROKER_CA_BUNDLE", str(tmp_path / "kubeconfig"))  # no certificate
    monkeypatch.setenv("AGENT_IDENTITY_MODE", "mtls")
    monkeypatch.setenv("AGENT_CLIENT_CERT_FILE", str(tmp_path / "tls.crt"))
    monkeypatch.setenv("AGENT_CLIENT_KEY_FILE", str(tmp_path / "tls.key"))
    monkeypatch.setenv("AGENT_KUBECONFIG", str(tmp_path / "missing"))
    assert agent_main.main(["--check-config"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":", 2)[1].strip() for line in lines] == [
        "AGENT_BROKER_CA_BUNDLE",
        "AGENT_CLIENT_CERT_FILE, AGENT_CLIENT_KEY_FILE",
        f"AGENT_KUBECONFIG ({tmp_path / 'missing'})",
    ]
    assert "--check-config" in agent_main_help()


def agent_main_help() -> str:
    out = run("agent", {}, "--help")
    assert out.returncode == 0
    return out.stdout


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_a_port_that_cannot_be_had_stops_the_start_with_one_line(
    component: str, tmp_path: Path
) -> None:
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(
        "data: {client_id: a, client_secret: s, tokens_endpoint: 'https://oauth.test/token'}"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if component == "agent":
            env = {
                "AGENT_KUBECONFIG": str(kubeconfig(tmp_path)),
                "AGENT_HEALTH_ADDRESS": f"127.0.0.1:{port}",
            }
            module, variable = "agent", "AGENT_HEALTH_ADDRESS"
        else:
            env = {
                "KUBECONFIG": str(kubeconfig(tmp_path)),
                "BROKER_DIRECTOR_URL": "https://director.test/graphql",
                "BROKER_DIRECTOR_CREDENTIALS_FILE": str(credentials),
                "BROKER_HOST": "127.0.0.1",
                "BROKER_PORT": str(port),
            }
            module, variable = "control_plane_broker", "BROKER_HOST, BROKER_PORT"
        out = run(module, env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"{PROG[component]}: {variable}: cannot listen on 127.0.0.1:{port} (Address already in use)"
    ]


# --- the charts' schemas --------------------------------------------------------------------

CHART_ENV = re.compile(
    r"name: ((?:BROKER|AGENT)_[A-Z0-9_]+), value: \{\{ \.Values\.([A-Za-z0-9_.]+) \| quote \}\}"
)


def chart_values(chart: str) -> dict[str, str]:
    """Each variable the chart sets straight from one value, with that value's path."""
    helpers = (REPO_ROOT / "charts" / chart / "templates" / "_helpers.tpl").read_text()
    return dict(CHART_ENV.findall(helpers))


def schema_node(chart: str, path: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(
        (REPO_ROOT / "charts" / chart / "values.schema.json").read_text()
    )
    for part in path.split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("chart", "component"), [("compass-broker", "broker"), ("compass-agent", "agent")]
)
def test_the_chart_schema_holds_the_settings_bounds(chart: str, component: str) -> None:
    model, _, prefix = COMPONENTS[component]
    compared: list[str] = []
    for variable, path in chart_values(chart).items():
        field = model.model_fields[variable.removeprefix(prefix).lower()]
        node = schema_node(chart, path)
        if field.annotation in (int, float):
            kinds = {"integer"} if field.annotation is int else {"number"}
            assert {node["type"]} == kinds, f"{path} ({variable}): type"
            declared = {
                k: float(v)
                for k, v in node.items()
                if k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
            }
            assert declared == bounds(field), f"{path} ({variable}): bounds"
            assert all(math.isfinite(v) for v in declared.values())
            compared.append(path)
        elif choices := literal_choices(field):
            assert set(node["enum"]) == choices, f"{path} ({variable}): choices"
            compared.append(path)
        elif rules := string_rules(field):
            declared = {k: v for k, v in node.items() if k in ("pattern", "minLength", "maxLength")}
            assert declared == rules, f"{path} ({variable}): form"
            compared.append(path)
    numeric_values = {
        "compass-broker": {
            "director.maxConcurrency",
            "director.timeoutSeconds",
            "policy.rateLimitPerMinute",
            "policy.rateLimitBurst",
            "breaker.failureThreshold",
            "breaker.openSeconds",
            "kcpNamespace",
            "identity.audience",
        },
        "compass-agent": {
            "broker.timeoutSeconds",
            "gracePeriods.handoverSeconds",
            "gracePeriods.connectionSeconds",
            "refusalCadenceSeconds",
            "backoffCapSeconds",
            "identity.audience",
        },
    }[chart]
    assert numeric_values <= set(compared)  # the mapping was read, not skipped


def literal_choices(field: FieldInfo) -> set[str]:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, str) and annotation is not str:
        return {str(member.value) for member in annotation}  # type: ignore[attr-defined]
    args = get_args(annotation)
    return {a for a in args if isinstance(a, str)} if args else set()


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_help_shows_each_numbers_bounds_from_its_field(component: str) -> None:
    model, main_module, prefix = COMPONENTS[component]
    shown = main_module._settings_help()
    for name, field in numeric_fields(model).items():
        b = {k: int(v) if v.is_integer() else v for k, v in bounds(field).items()}
        low = f">= {b['minimum']}" if "minimum" in b else f"> {b['exclusiveMinimum']}"
        high = f"<= {b['maximum']}" if "maximum" in b else f"< {b['exclusiveMaximum']}"
        line = rf"^  {prefix}{name.upper()} \[[^]]*\] \({re.escape(low)}, {re.escape(high)}\)$"
        assert re.search(line, shown, re.MULTILINE), line
