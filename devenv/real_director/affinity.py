"""CPU affinity for the parts of the stack: Director, PostgreSQL and the gateway on chosen cores.

A process or thread inherits the affinity of the thread that starts it, from its first
instruction: Go sizes GOMAXPROCS by it, PostgreSQL's backends (forked by the postmaster) and
the gateway's thread inherit it. So rather than moving running processes (every thread of a Go
process, every child of the postmaster), `started_on` runs the start itself with the calling
thread moved to the chosen cores, and moves the thread back afterwards. Only the calling thread
moves (Linux `sched_setaffinity` on thread 0): the rest of the caller's process keeps its cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def parse_cpus(spec: str) -> frozenset[int]:
    """`0`, `0,2` or `0-3,6` as a set of CPU numbers (ValueError when empty or malformed)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        low, sep, high = part.partition("-")
        first, last = int(low), int(high) if sep else int(low)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"no CPU in {spec!r}")
    return frozenset(cpus)


def checked(cpus: Iterable[int] | None) -> frozenset[int] | None:
    """`cpus` when the machine has all of them, else ValueError naming the ones it has. (Not the
    caller's own affinity: a benchmark keeps itself off the CPUs it gives the stack.)"""
    if cpus is None:
        return None
    wanted = frozenset(cpus)
    machine = frozenset(range(os.cpu_count() or 1))
    if not wanted or not wanted <= machine:
        raise ValueError(f"CPUs {sorted(wanted)} are not all among the usable {sorted(machine)}")
    return wanted


def started_on(
    cpus: frozenset[int] | None, start: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`start(*args, **kwargs)` with the calling thread on `cpus` (None: as it is), so that what
    it starts runs there for good."""
    if cpus is None:
        return start(*args, **kwargs)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return start(*args, **kwargs)
    finally:
        os.sched_setaffinity(0, before)
