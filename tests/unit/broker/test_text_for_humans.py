"""Free text from runtimes reaches operators' terminals without control or bidi characters: at
the HTTP edge (a report's `lastError`) and in every Event the broker writes (issue 28, item 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from control_plane_broker.api.app import ConnectionReportBody, report_from_body
from control_plane_broker.kube.kyma_events import KymaEvents

HOSTILE = "x509: \x1b[31mexpired\x1b[0m\x07\r\nroot\u202etxt.exe\u2067\u200f"


def test_a_reports_error_is_cleaned_at_the_edge() -> None:
    body = ConnectionReportBody(
        connectionState="ConnectionFailed",
        observedAt=datetime(2027, 1, 1, tzinfo=UTC),
        lastError=HOSTILE,
    )
    cleaned = report_from_body(body).last_error
    assert cleaned is not None
    assert cleaned.isprintable()
    assert "expired" in cleaned
    assert "txt.exe" in cleaned


class Recorder:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def record(self, _: Any, *, type_: str, reason: str, message: str) -> None:
        self.messages.append(message)


async def test_every_event_message_is_cleaned() -> None:
    recorder = Recorder()
    events = KymaEvents(recorder, namespace="kcp-system")  # type: ignore[arg-type]
    await events.record(kyma_name="rt", kyma_uid="u", reason="RuntimeNotConnected", message=HOSTILE)
    [message] = recorder.messages
    assert message.isprintable()
    assert "\x1b" not in message
    assert "\u202e" not in message
