"""devenv/real_director/affinity.py: what a start runs on, and the caller's thread afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from devenv.real_director.affinity import checked, parse_cpus, started_on


def test_cpu_lists_parse_as_taskset_writes_them() -> None:
    assert parse_cpus("0") == {0}
    assert parse_cpus("0,2") == {0, 2}
    assert parse_cpus("0-2, 5") == {0, 1, 2, 5}
    for bad in ("", ",", "a", "3-1", "-1"):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_only_the_machines_cpus_are_accepted_also_those_the_caller_left() -> None:
    machine = set(range(os.cpu_count() or 1))
    assert checked(None) is None
    assert checked(machine) == machine
    with pytest.raises(ValueError, match="usable"):
        checked({max(machine) + 1})
    with pytest.raises(ValueError):
        checked(set())
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(before)})
    try:
        assert checked({min(machine)}) == {min(machine)}
    finally:
        os.sched_setaffinity(0, before)


def _affinity_of_child() -> set[int]:
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(*sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(c) for c in out.stdout.split()}


def test_what_a_start_starts_stays_on_the_cpus_and_the_caller_moves_back() -> None:
    usable = os.sched_getaffinity(0)
    one = frozenset({min(usable)})
    seen: dict[str, set[int]] = {}

    def start() -> None:
        seen["child"] = _affinity_of_child()
        thread = threading.Thread(target=lambda: seen.update(thread=os.sched_getaffinity(0)))
        thread.start()
        thread.join()

    started_on(one, start)
    assert seen == {"child": set(one), "thread": set(one)}
    assert os.sched_getaffinity(0) == usable
    assert started_on(None, _affinity_of_child) == usable


def test_the_caller_moves_back_also_when_the_start_fails() -> None:
    usable = os.sched_getaffinity(0)

    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        started_on(frozenset({min(usable)}), fails)
    assert os.sched_getaffinity(0) == usable
