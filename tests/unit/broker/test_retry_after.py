"""The values of `Retry-After`, pinned: every stage's refusal, for the same inputs, answers the
same header it answered before Retry-After had one home (the three paths of issue 30: the
first-contact limit's wait, a Director capacity reservation aimed early, and rounding with
jitter for everything else). Only the three helpers below follow the code; the tables stay.

Where the values come from: each row's comment works its value out by hand from the rules, so a
changed value is a changed rule, not a new golden number:

- header (`overload/retry_after.header_seconds`, applied by `api/problems.problem_for`):
  max(1, ceil(max(0, wait) + rand * jitter)), the wait 1 s when the error knows none; jitter
  only for an error that spreads the herd (`spread`): not a first-contact wait, a capacity
  reservation or a reservation after the next probe, which get jitter 0 whatever `jitter_max`.
- first contact (`overload/first_contact_limit.FirstContactLimit.refusal_wait`): the rate is
  capacity / hold a second; the wait is ahead / rate, refused only beyond `max_wait` (5 s here);
  a newcomer is told max(the last announced end, its wait), at most 300 s (`longest_wait`), and
  the next announced end moves one place (1 / rate) further.
- reservation (`overload/retry_after.reservation_wait`): lead = max_wait / 4; latest =
  min(wait / 1.1, wait - 1) - lead (an agent adds up to a tenth, at least a second, of jitter);
  earliest = wait - max_wait; told max(1, floor(latest), ceil(earliest)).
"""

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
        # 100 a second: 501 ahead is 5.01 s (> 5 s, refused); each next one a place (0.01 s)
        # later: 5.01, 5.02, 5.03 s, rounded up, no jitter
        (10, 0.1, 501, ["6", "6", "6"]),
        (10, 0.1, 2_000, ["20"]),  # 100 a second: 20 s
        # 10**7 s by the rate: never further out than the agent's longest backoff, 300 s
        (10, 0.1, 10**9, ["300"]),
        (32, 0.4, 401, ["6", "6"]),  # 80 a second: 5.0125 s, then a place on: 5.025 s
        # 1 / 1.3 a second: 10 ahead is 13 s, but 10 / (1 / 1.3) is 13.000000000000002 in
        # binary floating point, rounded up: 14; the second one place (1.3 s) on: 14.3 s, 15
        (1, 1.3, 10, ["14", "15"]),
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
        # (lead 1.25 s with max_wait 5, 2.5 s with 10, none with 0)
        (0.5, 5.0, "1"),  # latest min(0.45, -0.5) - 1.25 < 0: at least a second
        (2.0, 5.0, "1"),  # latest min(1.82, 1) - 1.25 = -0.25: at least a second
        (6.0, 5.0, "3"),  # latest min(5.45, 5) - 1.25 = 3.75 -> 3; earliest 1
        (12.0, 5.0, "9"),  # latest 10.91 - 1.25 = 9.66 -> 9; earliest 7
        (33.0, 5.0, "28"),  # latest 30 - 1.25 = 28.75 -> 28; earliest 28
        (33.0, 10.0, "27"),  # latest 30 - 2.5 = 27.5 -> 27; earliest 23
        (100.0, 5.0, "95"),  # latest 90.91 - 1.25 = 89.66 -> 89; earliest 95 wins
        (300.0, 0.0, "300"),  # latest 272.7; earliest 300 - 0 = 300 wins: no waiting room
        (1.0, 0.0, "1"),  # latest min(0.91, 0) = 0; earliest 1
    ],
)
def test_reservations_are_aimed_early_without_jitter(
    wait: float, max_wait: float, expected: str
) -> None:
    assert reservation_header(wait, max_wait=max_wait) == expected


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        (1.0, "1"),  # latest min(0.91, 0) - 1.25 < 0: at least a second
        (7.5, "5"),  # latest min(6.82, 6.5) - 1.25 = 5.25 -> 5; earliest 2.5 -> 3
        (40.0, "35"),  # latest 36.36 - 1.25 = 35.11 -> 35; earliest 35
    ],
)
def test_a_reservation_after_the_next_probe_is_aimed_early_too(wait: float, expected: str) -> None:
    assert reservation_header(wait, max_wait=5.0, down=True) == expected


@pytest.mark.parametrize(
    ("base", "jitter_max", "rand", "expected"),
    [
        (0.0, 0.0, 0.0, "1"),  # ceil(0) = 0: at least a second
        (2.2, 0.0, 0.9, "3"),  # ceil(2.2), no jitter to add
        (2.0, 5.0, 0.5, "5"),  # ceil(2 + 0.5 * 5 = 4.5)
        (30.0, 5.0, 0.999, "35"),  # ceil(30 + 4.995)
        (7.2, 5.0, 0.9, "12"),  # ceil(7.2 + 4.5 = 11.7)
        (-3.0, 2.0, 0.2, "1"),  # a negative wait counts as 0: ceil(0 + 0.4)
        (None, 5.0, 0.5, "4"),  # no wait known: a second, plus jitter: ceil(1 + 2.5)
    ],
)
def test_other_refusals_are_rounded_up_with_jitter(
    base: float | None, jitter_max: float, rand: float, expected: str
) -> None:
    assert spread_header(base, jitter_max=jitter_max, rand=rand) == expected


@pytest.mark.parametrize(
    ("base", "jitter", "rand", "expected"),
    [
        (0.0, 0.0, 0.0, 1),  # ceil(0) = 0: at least a second
        (2.2, 0.0, 0.9, 3),  # ceil(2.2), no jitter to add
        (2.0, 5.0, 0.5, 5),  # ceil(2 + 0.5 * 5 = 4.5)
        (30.0, 5.0, 0.999, 35),  # ceil(30 + 4.995)
    ],
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
        # a tenth: 30 + 3 is its reservation at the latest; 27.5 aims 2.5 s early
        (33.0, 10.0, 27.0),
        # not more than max_wait early (it would be sent away again): 125 - 10; latest 111.1
        (125.0, 10.0, 115.0),
        (33.0, 8.0, 28.0),  # lead a quarter of 8, 2 s: 30 - 2 = 28 (by 0.3 of it, 27.6: 27)
        (33.0, 4.0, 29.0),  # a smaller waiting room: aimed a second early, 29 at the earliest
        (33.0, 0.0, 33.0),  # no waiting room: exactly its reservation (latest 30, earliest 33)
    ],
)
def test_agents_are_told_a_time_that_gets_them_there_by_their_reservation(
    wait: float, max_wait: float, told: float
) -> None:
    assert reservation_wait(wait, max_wait=max_wait) == told
