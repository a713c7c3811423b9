"""Retry-After in whole seconds with jitter (`retry`)."""

from __future__ import annotations

import pytest

from control_plane_broker.overload.retry_after import retry_after_seconds


@pytest.mark.parametrize(
    ("base", "jitter", "rand", "expected"),
    [(0.0, 0.0, 0.0, 1), (2.2, 0.0, 0.9, 3), (2.0, 5.0, 0.5, 5), (30.0, 5.0, 0.999, 35)],
)
def test_retry_after_is_whole_seconds_with_jitter(
    base: float, jitter: float, rand: float, expected: int
) -> None:
    assert retry_after_seconds(base, jitter_max=jitter, rand=lambda: rand) == expected
