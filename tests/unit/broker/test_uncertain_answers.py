"""Uncertain answers to writing calls: each counted, one WARNING per burst."""

from __future__ import annotations

import logging

import pytest

from control_plane_broker.director.uncertain_answers import QUIET_SECONDS, UncertainAnswers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_counted_per_answer_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[str] = []
    clock = Clock()
    answers = UncertainAnswers(count=counted.append, clock=clock)
    with caplog.at_level(logging.INFO, logger="control_plane_broker.director.uncertain_answers"):
        for n in range(50):  # one every second: one burst
            clock.now += 1
            answers.record("registerRuntime" if n % 2 else "setRuntimeLabel", "code 10")
        assert len(counted) == 50
        assert counted.count("registerRuntime") == 25
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert warnings[0].operation == "setRuntimeLabel"  # type: ignore[attr-defined]
        assert warnings[0].answer == "code 10"  # type: ignore[attr-defined]
        # Quiet for a while, then the next burst warns again.
        clock.now += QUIET_SECONDS
        answers.record("requestOneTimeTokenForRuntime", "x" * 1000)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert len(warnings[1].answer) == 300  # type: ignore[attr-defined]
