"""The broker's own loop backoff (`backoff`)."""

from __future__ import annotations

from control_plane_broker.backoff import backoff, watch_backoff


def test_backoff_doubles_up_to_cap() -> None:
    assert [backoff(n, base=1, cap=5) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]


def test_watches_back_off_from_half_a_second_to_thirty() -> None:
    assert [watch_backoff(n) for n in (1, 2, 7, 8)] == [0.5, 1.0, 30.0, 30.0]
