"""The circuit breaker's pure transitions (`circuit_breaker`)."""

from __future__ import annotations

import pytest

from control_plane_broker.overload import circuit_breaker as cb

POLICY = cb.BreakerPolicy(failure_threshold=3, open_seconds=10.0)


def test_breaker_opens_after_threshold_consecutive_failures() -> None:
    b = cb.Breaker()
    for i in range(2):
        b = cb.record_failure(b, POLICY, now=float(i))
        assert b.state is cb.State.CLOSED
    b = cb.record_failure(b, POLICY, now=5.0)
    assert b.state is cb.State.OPEN
    b2, adm = cb.admit(b, POLICY, now=6.0)
    assert not adm.allowed
    assert adm.retry_after == pytest.approx(9.0)
    assert b2 == b


def test_breaker_success_resets_the_consecutive_count() -> None:
    b = cb.record_failure(cb.record_failure(cb.Breaker(), POLICY, 0), POLICY, 0)
    b = cb.record_success(b)
    b = cb.record_failure(b, POLICY, 1)
    assert b.state is cb.State.CLOSED
    assert b.failures == 1


def test_one_runtimes_internal_errors_never_open_the_breaker() -> None:
    b = cb.Breaker()
    for i in range(50):
        b = cb.record_ambiguous(b, POLICY, float(i), "runtime-1")
    assert b.state is cb.State.CLOSED
    assert b.failures == 1
    assert b.suspects == frozenset({"runtime-1"})


def test_internal_errors_of_different_runtimes_in_a_row_open_the_breaker() -> None:
    b = cb.record_ambiguous(cb.Breaker(), POLICY, 0.0, "a")
    b = cb.record_ambiguous(b, POLICY, 1.0, "a")
    b = cb.record_ambiguous(b, POLICY, 2.0, "b")
    assert b.state is cb.State.CLOSED
    # Outages and internal errors add up: Director failing everyone, one way or the other.
    b = cb.record_failure(b, POLICY, 3.0)
    assert b.state is cb.State.OPEN
    assert b.suspects == frozenset()
    assert b.opened_at == 3.0


def test_a_success_ends_the_run_of_suspects() -> None:
    b = cb.record_ambiguous(cb.Breaker(), POLICY, 0.0, "a")
    b = cb.record_success(b)
    assert b == cb.Breaker()
    b = cb.record_ambiguous(b, POLICY, 1.0, "a")
    assert b.failures == 1


def test_a_probe_that_meets_an_internal_error_opens_the_breaker_again() -> None:
    b = cb.Breaker(state=cb.State.HALF_OPEN, failures=3, probe_in_flight=True, suspects=frozenset())
    b = cb.record_ambiguous(b, POLICY, 20.0, "a")
    assert b.state is cb.State.OPEN
    assert b.opened_at == 20.0


@pytest.mark.parametrize(
    ("probe_ok", "end_state"), [(True, cb.State.CLOSED), (False, cb.State.OPEN)]
)
def test_breaker_half_open_admits_exactly_one_probe(probe_ok: bool, end_state: cb.State) -> None:
    b = cb.Breaker(state=cb.State.OPEN, failures=3, opened_at=0.0)
    b, first = cb.admit(b, POLICY, now=10.0)
    assert first.allowed
    assert b.state is cb.State.HALF_OPEN
    b, second = cb.admit(b, POLICY, now=10.1)
    assert not second.allowed
    b = cb.record_success(b) if probe_ok else cb.record_failure(b, POLICY, now=11.0)
    assert b.state is end_state
    if not probe_ok:
        assert b.opened_at == 11.0  # the timer restarts


@pytest.mark.parametrize(
    ("breaker", "now", "refused"),
    [
        (cb.Breaker(), 0.0, False),
        (cb.Breaker(failures=2), 0.0, False),
        (cb.Breaker(state=cb.State.OPEN, opened_at=100.0), 105.0, True),
        (cb.Breaker(state=cb.State.OPEN, opened_at=100.0), 110.0, False),  # the probe
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True), 0.0, True),
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=False), 0.0, False),
    ],
)
def test_would_refuse_answers_like_admit_without_changing_anything(
    breaker: cb.Breaker, now: float, refused: bool
) -> None:
    assert cb.would_refuse(breaker, POLICY, now) is refused
    _, permit = cb.admit(breaker, POLICY, now)
    assert permit.allowed is not refused


def test_breaker_released_probe_lets_the_next_caller_probe() -> None:
    b = cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True)
    b = cb.release_probe(b)
    _, adm = cb.admit(b, POLICY, now=0)
    assert adm.allowed
