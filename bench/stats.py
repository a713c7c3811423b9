"""Pure arithmetic of the benchmarks: bounds, percentiles, time windows, duplicate counts.

Nothing here does I/O or reads a clock, so every figure in the report can be checked by a unit
test from plain numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

# What the issue counts for a runtime that connects for the first time.
CALLS_PER_NEW_RUNTIME = 2  # registerRuntime + requestOneTimeTokenForRuntime


def capacity_bound(
    n: int, *, latency: float, capacity: int, calls_per_runtime: float = CALLS_PER_NEW_RUNTIME
) -> float:
    """Shortest time in which Director can serve `n` runtimes: n * calls * L / C seconds.

    Director serves at most `capacity` calls at once, each taking `latency` seconds, so its
    throughput is C / L calls per second whatever the broker does.
    """
    if n < 0 or latency < 0 or capacity < 1 or calls_per_runtime < 0:
        raise ValueError("n, latency and calls must not be negative; capacity at least 1")
    return n * calls_per_runtime * latency / capacity


def ratio(value: float | None, bound: float) -> float | None:
    """value / bound, or None when either is missing or the bound is zero."""
    if value is None or bound <= 0:
        return None
    return value / bound


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Same definition as numpy's default ("linear"): p = v[floor(h)] + (h - floor(h)) *
    (v[floor(h)+1] - v[floor(h)]) with h = (len - 1) * q / 100 on the sorted values.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    h = (len(ordered) - 1) * q / 100
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def window_counts(times: Iterable[float], *, start: float, end: float, width: float) -> list[int]:
    """Events per consecutive window of `width` seconds in [start, end); a last partial
    window counts too. Events outside the range are ignored."""
    if width <= 0 or end < start:
        raise ValueError("width must be positive and end not before start")
    count = max(1, math.ceil((end - start) / width))
    out = [0] * count
    for t in times:
        if start <= t < end:
            out[min(int((t - start) // width), count - 1)] += 1
    return out


def max_in_sliding_window(times: Iterable[float], width: float) -> int:
    """The largest number of events inside any window [t, t + width)."""
    ordered = sorted(times)
    best = 0
    first = 0
    for last, t in enumerate(ordered):
        while ordered[first] <= t - width:
            first += 1
        best = max(best, last - first + 1)
    return best


def split_at_first_gap(times: Iterable[float], gap: float) -> tuple[list[float], list[float]]:
    """Splits sorted event times at the first pause of at least `gap` seconds: (burst, rest).

    While Director is down, the calls before the first such pause are the breaker opening
    (the threshold failures plus calls already in flight); what follows are probes.
    """
    ordered = sorted(times)
    for i in range(1, len(ordered)):
        if ordered[i] - ordered[i - 1] >= gap:
            return ordered[:i], ordered[i:]
    return ordered, []


def duplicate_registrations(runtime_ids: Iterable[str]) -> int:
    """Director registrations beyond the first for the same Kyma runtime ID."""
    counts = Counter(runtime_ids)
    return sum(c - 1 for c in counts.values() if c > 1)


def completion_time(connected_at: Sequence[float], *, since: float, expected: int) -> float | None:
    """Seconds from `since` until the `expected`-th connection, None if fewer connected."""
    if expected <= 0:
        return 0.0
    if len(connected_at) < expected:
        return None
    return max(0.0, sorted(connected_at)[expected - 1] - since)


def cumulative(times: Sequence[float], *, since: float) -> tuple[list[float], list[int]]:
    """Step series for a plot: (seconds since `since`, count connected by then)."""
    xs = [t - since for t in sorted(times)]
    return xs, list(range(1, len(xs) + 1))


def run_deadline(bound: float, *, cap: float, floor: float = 300.0, factor: float = 10.0) -> float:
    """How long one fleet run may take: long enough to see the tail (factor x the bound, at
    least `floor`), never longer than `cap`."""
    return min(cap, max(floor, factor * bound))


def split_at(times: Iterable[float], moment: float) -> tuple[list[float], list[float]]:
    """Sorted event times before `moment` and from it on."""
    ordered = sorted(times)
    return [t for t in ordered if t < moment], [t for t in ordered if t >= moment]


def mean_or_none(total: float, count: int) -> float | None:
    """total / count, None for no count (a figure that does not exist is not zero)."""
    return total / count if count else None
