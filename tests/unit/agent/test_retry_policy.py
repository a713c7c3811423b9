"""THE retry policy: capped exponential steps, full jitter, Retry-After honoured."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from agent.retry_policy import Jitter, RetryPolicy, jittered, next_delay, parse_retry_after, step


class Fixed:
    """An rng whose uniform() returns a fixed fraction of the range."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def uniform(self, a: float, b: float, /) -> float:
        return a + (b - a) * self.fraction


POLICY = RetryPolicy(base=1.0, factor=2.0, cap=300.0)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (9, 256.0), (10, 300.0), (50, 300.0), (10_000, 300.0)],
)
def test_step_grows_exponentially_and_is_capped(attempt: int, expected: float) -> None:
    assert step(POLICY, attempt) == expected


def test_step_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        step(POLICY, 0)


def test_full_jitter_spans_zero_to_step() -> None:
    assert next_delay(POLICY, 4, rng=Fixed(0.0)) == 0.0
    assert next_delay(POLICY, 4, rng=Fixed(1.0)) == 8.0
    assert next_delay(POLICY, 4, rng=Fixed(0.5)) == 4.0


def test_jittered_delays_stay_within_bounds_and_spread() -> None:
    rng = random.Random(7)
    delays = [next_delay(POLICY, 6, rng=rng) for _ in range(500)]
    assert all(0.0 <= d <= 32.0 for d in delays)
    assert max(delays) - min(delays) > 20  # a herd spreads out instead of retrying in step


def test_no_jitter_is_exactly_the_step() -> None:
    policy = RetryPolicy(base=0.5, factor=3.0, cap=10.0, jitter=Jitter.NONE)
    assert [next_delay(policy, a) for a in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 10.0]


def test_retry_after_is_obeyed_even_above_the_cap() -> None:
    policy = RetryPolicy(base=1.0, cap=5.0)
    assert next_delay(policy, 1, retry_after=60.0, rng=Fixed(0.0)) == 60.0
    # Jitter on top: at most the agent's own step (1 s at the first attempt).
    assert next_delay(policy, 1, retry_after=60.0, rng=Fixed(1.0)) == 61.0


def test_a_long_outage_does_not_outgrow_the_servers_answer() -> None:
    # After many 503s our own step is at the cap (300 s); the server's Retry-After still
    # decides, with jitter of at most a tenth of the wait (at least `base`).
    assert next_delay(POLICY, 40, retry_after=3.0, rng=Fixed(1.0)) == 4.0
    assert next_delay(POLICY, 40, retry_after=80.0, rng=Fixed(1.0)) == 88.0
    assert next_delay(POLICY, 40, retry_after=80.0, rng=Fixed(0.0)) == 80.0
    # Without a hint the exponential backoff applies as before.
    assert next_delay(POLICY, 6, rng=Fixed(1.0)) == 32.0


def test_invalid_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(base=0)
    with pytest.raises(ValueError):
        RetryPolicy(factor=0.5)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("30", 30.0),
        (" 5 ", 5.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past: no wait
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after(header, now=now) == expected


def test_module_imports_no_io_libraries() -> None:
    code = (
        "import sys, agent.retry_policy, agent.decide, agent.cluster_objects, agent.outcomes; "
        "bad = [m for m in ('httpx', 'kubernetes') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, 480.0), (0.5, 600.0), (1.0, 720.0)])
def test_jittered_spreads_twenty_percent_either_way(fraction: float, expected: float) -> None:
    assert jittered(600.0, rng=Fixed(fraction)) == pytest.approx(expected)


def test_jittered_without_rng_stays_in_the_window() -> None:
    values = [jittered(10.0) for _ in range(200)]
    assert all(8.0 <= v <= 12.0 for v in values)
    assert len(set(values)) > 1
