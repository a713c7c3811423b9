"""The values of `Retry-After`, pinned: every stage's refusal, for the same inputs, answers the
same header it answered before Retry-After had one home (the three paths of issue 30: the
first-contact limit's wait, a Director capacity reservation aimed early, and rounding with
jitter for everything else). Only the three helpers below follow the code; the tables stay."""

from __future__ import annotations

import pytest

from control_plane_broker import errors
from control_plane_broker.api.problems import problem_for
from control_plane_broker.overload.first_contact_limit import FirstContactLimit
from control_plane_broker.overload.retry_after import header_seconds, reservation_wait


def header(exc: errors.BrokerError, *, jitter_max: float, rand: float) -> str:
    problem = problem_for(exc, instance="/x", jitter_max=jitter_max, rand=lambda: rand)
    return problem.headers["Retry-After"]


def first_contact_headers(*, capacity: int, hold: float, ahead: int, times: int) -> list[str]:
    """`times` newcomers refused one after the other with `ahead` in the shared queue."""
    limit = FirstContactLimit(capacity=capacity, max_wait=5.0, hold=hold)
    waits = [limit.refusal_wait(ahead=ahead, now=0.0) for _ in range(times)]
    return [
        header(errors.FirstContactsBusy("busy", retry_after=wait), jitter_max=5, rand=0.9)
        for wait in waits
    ]


def reservation_header(wait: float, *, max_wait: float, down: bool = False) -> str:
    """A deferred request whose reservation starts `wait` seconds ahead (`down`: the breaker is
    open and the reservation is after the next probe)."""
    error = errors.CompassDown if down else errors.CapacityReserved
    exc = error("later", retry_after=reservation_wait(wait, max_wait=max_wait))
    return header(exc, jitter_max=5, rand=0.9)


def spread_header(base: float | None, *, jitter_max: float, rand: float) -> str:
    return header(errors.RateLimited("slow", retry_after=base), jitter_max=jitter_max, rand=rand)


@pytest.mark.parametrize(
    ("capacity", "hold", "ahead", "expected"),
    [
        (10, 0.1, 501, ["6", "6", "6"]),  # 5.01 s, 5.02 s, 5.03 s: rounded up, no jitter
        (10, 0.1, 2_000, ["20"]),
        (10, 0.1, 10**9, ["300"]),  # never further out than the agent's longest backoff
        (32, 0.4, 401, ["6", "6"]),
        (1, 1.3, 10, ["14", "15"]),  # the second after the first, one place apart
    ],
)
def test_first_contact_refusals(
    capacity: int, hold: float, ahead: int, expected: list[str]
) -> None:
    assert (
        first_contact_headers(capacity=capacity, hold=hold, ahead=ahead, times=len(expected))
        == expected
    )


@pytest.mark.parametrize(
    ("wait", "max_wait", "expected"),
    [
        (0.5, 5.0, "1"),
        (2.0, 5.0, "1"),
        (6.0, 5.0, "3"),
        (12.0, 5.0, "9"),
        (33.0, 5.0, "28"),
        (33.0, 10.0, "27"),
        (100.0, 5.0, "95"),
        (300.0, 0.0, "300"),
        (1.0, 0.0, "1"),
    ],
)
def test_reservations_are_aimed_early_without_jitter(
    wait: float, max_wait: float, expected: str
) -> None:
    assert reservation_header(wait, max_wait=max_wait) == expected


@pytest.mark.parametrize(("wait", "expected"), [(1.0, "1"), (7.5, "5"), (40.0, "35")])
def test_a_reservation_after_the_next_probe_is_aimed_early_too(wait: float, expected: str) -> None:
    assert reservation_header(wait, max_wait=5.0, down=True) == expected


@pytest.mark.parametrize(
    ("base", "jitter_max", "rand", "expected"),
    [
        (0.0, 0.0, 0.0, "1"),
        (2.2, 0.0, 0.9, "3"),
        (2.0, 5.0, 0.5, "5"),
        (30.0, 5.0, 0.999, "35"),
        (7.2, 5.0, 0.9, "12"),
        (-3.0, 2.0, 0.2, "1"),
        (None, 5.0, 0.5, "4"),  # no wait known: a second, plus jitter
    ],
)
def test_other_refusals_are_rounded_up_with_jitter(
    base: float | None, jitter_max: float, rand: float, expected: str
) -> None:
    assert spread_header(base, jitter_max=jitter_max, rand=rand) == expected


@pytest.mark.parametrize(
    ("base", "jitter", "rand", "expected"),
    [(0.0, 0.0, 0.0, 1), (2.2, 0.0, 0.9, 3), (2.0, 5.0, 0.5, 5), (30.0, 5.0, 0.999, 35)],
)
def test_header_seconds_are_whole_seconds_with_jitter(
    base: float, jitter: float, rand: float, expected: int
) -> None:
    assert header_seconds(base, jitter_max=jitter, rand=lambda: rand) == expected


@pytest.mark.parametrize(
    ("wait", "max_wait", "told"),
    [
        (0.2, 10.0, 1.0),  # never less than the header's second
        (5.0, 10.0, 1.0),  # a second of jitter, aimed 2.5 s (max_wait / 4) early: 1.5, whole
        (9.0, 10.0, 5.0),  # 8 + a second of jitter is its reservation; aimed 2.5 s before: 5.5
        (
            33.0,
            10.0,
            27.0,
        ),  # a tenth: 30 + 3 is its reservation at the latest; 27.5 aims 2.5 s early
        (125.0, 10.0, 115.0),  # not more than max_wait early: it would be sent away again
        (33.0, 4.0, 29.0),  # a smaller waiting room: aimed a second early, 29 at the earliest
        (33.0, 0.0, 33.0),  # no waiting room: exactly its reservation
    ],
)
def test_agents_are_told_a_time_that_gets_them_there_by_their_reservation(
    wait: float, max_wait: float, told: float
) -> None:
    assert reservation_wait(wait, max_wait=max_wait) == told
