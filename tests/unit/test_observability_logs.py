"""The one log setup: JSON lines with `extra=` fields, exceptions without their messages, and
every credential shape we know masked in the finished line."""

from __future__ import annotations

import io
import json
import logging

import pytest

from devenv import pki
from observability import logs
from observability.logs import JsonFormatter, redact

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
PEM = pki.private_key_pem(pki.new_ec_key()).decode()


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"token {JWT} seen", "eyJhbGciOiJSUzI1NiJ9"),
        ("Authorization: Bearer s3cr3t-value", "s3cr3t-value"),
        ("authorization: basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        (f"key material {PEM} end", PEM.splitlines()[1]),
        ("-----BEGIN CERTIFICATE-----\nMIIBcut-off", "MIIBcut-off"),
        ('{"TOKEN": "ott-123", "x": 1}', "ott-123"),
        ('{"token": "ott-456"}', "ott-456"),
        ("GET /x?token=abc123&b=2", "abc123"),
        ("token: plain-yaml-token", "plain-yaml-token"),
        ('{"msg": "sent {\\"client_secret\\": \\"cs-1\\"}"}', "cs-1"),
        ("password=hunter2", "hunter2"),
    ],
)
def test_redact_masks_each_credential_shape(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize(
    "text",
    ["token_file=/var/run/token", "tokens_endpoint: https://x", "the token was written"],
)
def test_redact_leaves_what_only_names_a_token(text: str) -> None:
    assert redact(text) == text


def line_for(record: logging.LogRecord) -> dict[str, object]:
    formatted = JsonFormatter().format(record)
    assert "\n" not in formatted
    parsed: dict[str, object] = json.loads(formatted)
    return parsed


def test_a_line_has_extras_and_is_redacted() -> None:
    record = logging.makeLogRecord(
        {
            "name": "agent",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "pulled %s",
            "args": ("it",),
            "runtime_id": "rt-1",
            "header": f"Bearer {JWT}",
            "pem": PEM,
        }
    )
    line = line_for(record)
    assert line["msg"] == "pulled it"
    assert line["level"] == "info"
    assert line["logger"] == "agent"
    assert line["runtime_id"] == "rt-1"
    assert JWT not in json.dumps(line)
    assert str(line["pem"]).strip() == "[redacted-pem]"
    assert str(line["ts"]).endswith("Z")


def test_an_exception_gives_its_type_and_stack_but_not_its_message() -> None:
    try:
        raise ValueError("kubeconfig snippet: token: abcdefsecret")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), exc_info=__import__("sys").exc_info()
        )
    line = line_for(record)
    assert line["error_type"] == "ValueError"
    assert "test_an_exception_gives_its_type" in str(line["stack"])
    assert "abcdefsecret" not in json.dumps(line)


def test_setup_writes_json_lines_to_stderr_at_the_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("warning")
        logging.getLogger("t").info("hidden")
        logging.getLogger("t").warning("shown", extra={"token": "ott-9"})
        assert logging.getLogger("httpx").level == logging.WARNING
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [x["msg"] for x in lines] == ["shown"]
    assert lines[0]["token"] == "[redacted]"


def test_uvicorns_colour_copy_is_dropped_and_no_escape_reaches_a_line() -> None:
    # What uvicorn logs at start: the plain message and a coloured copy for its own console.
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "Started server process [%d] \x1b[1mnow\x1b[0m",
            "args": (42,),
            "color_message": "Started server process [\x1b[36m%d\x1b[0m]",
            "path": "/v1/runtimes/\x1b[2Jx/token",
        }
    )
    formatted = JsonFormatter().format(record)
    assert "\\u001b" not in formatted
    assert "\x1b" not in formatted
    line = json.loads(formatted)
    assert "color_message" not in line
    assert line["msg"] == "Started server process [42] now"
    assert line["path"] == "/v1/runtimes/x/token"


def test_a_line_logged_while_a_request_id_is_bound_carries_it() -> None:
    record = logging.makeLogRecord({"name": "x", "levelname": "INFO", "msg": "m"})
    assert "request_id" not in line_for(record)
    token = logs.bind_request_id("req-1")
    try:
        assert line_for(record)["request_id"] == "req-1"
        assert logs.current_request_id() == "req-1"
    finally:
        logs.unbind_request_id(token)
    assert "request_id" not in line_for(record)


def test_redact_masks_jwts_and_bearer_values() -> None:
    text = (
        'token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl and "Authorization: Bearer s3cr3t"'
    )
    out = redact(text)
    assert "eyJhbGciOiJSUzI1NiJ9" not in out
    assert "s3cr3t" not in out
