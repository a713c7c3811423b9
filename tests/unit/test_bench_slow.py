"""The slow-Director scenario's figures and its section of the report (`bench/slow.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import slow
from bench.slow import Interval


def test_the_bound_is_the_slots_work_plus_the_last_call() -> None:
    # 200 runtimes x 2 calls x 4 s over 10 slots, and the last token after its registration.
    assert slow.latency_bound(200, latency=4.0, slots=10) == pytest.approx(164.0)
    with pytest.raises(ValueError):
        slow.latency_bound(1, latency=1.0, slots=0)


def _calls(slots: int, *, gap: tuple[float, float] | None = None) -> list[Interval]:
    """Each slot busy with 1 s calls for 10 s, one slot idle during `gap`, 12 registrations."""
    calls = []
    for slot in range(slots):
        for t in range(10):
            if slot == 0 and gap is not None and gap[0] <= t < gap[1]:
                continue
            calls.append(Interval(float(t), t + 1.0, "registerRuntime" if t < 1 else "token"))
    calls += [Interval(9.0 + i / 10, 9.5, "registerRuntime") for i in range(2)]
    return calls


def test_in_flight_is_averaged_per_second_while_a_registration_waits_for_every_slot() -> None:
    full = slow.in_flight(_calls(4), slots=4)
    # 6 registrations; the window ends at the start of the (6 - 4 + 1)-th: the third, at 0.
    # Here that is the window's start too: nothing to judge, all fine.
    assert (full.window_from, full.window_to, full.worst) == (0.0, 0.0, 1.0)
    calls = _calls(4, gap=(3, 5)) + [Interval(9.6, 9.9, "registerRuntime")] * 4
    flight = slow.in_flight(calls, slots=4)
    assert (flight.window_from, flight.window_to) == (0.0, 9.6)
    assert (flight.worst, flight.worst_at) == (0.75, 3.0)
    assert flight.at_target == pytest.approx(7 / 9)
    assert flight.series[:6] == (1.0, 1.0, 1.0, 0.75, 0.75, 1.0)
    assert slow.in_flight(calls, slots=4, not_before=5.0).worst == 1.0


def _run(target: str, seconds: float = 170.0) -> slow.SlowRun:
    return slow.SlowRun(
        target=target,
        commit="abc1234",
        started="2026-12-06 21:00 UTC",
        n=200,
        slots=10,
        latency_min=3.0,
        latency_max=5.0,
        connected=200,
        seconds=seconds,
        mean_latency=4.0,
        bound=164.0,
        window_from=1.0,
        window_to=150.0,
        worst_second=0.9,
        worst_second_at=20.0,
        seconds_at_target=1.0,
        mean_in_flight=0.99,
        series=[0.9, 1.0],
    )


def test_a_run_meets_its_targets_only_within_the_ratio_and_the_in_flight_target() -> None:
    assert _run("simulator").met
    assert not _run("simulator", seconds=190.0).met  # 1.16x
    assert not slow.SlowRun(**{**_run("simulator").__dict__, "worst_second": 0.79}).met


def test_each_target_rewrites_only_its_own_row_and_the_section_only(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    data = tmp_path / "benchmarks.json"
    report.write_text("# Benchmarks\n\n## 1. Cold start\n\nrows\n\n## Notes\n\n- a note\n")
    data.write_text(json.dumps({"runs": [1, 2], "real_director": {"x": 1}}))
    slow.merge_docs(tmp_path, [_run("simulator")], report=report.name, data_file=data.name)
    slow.merge_docs(tmp_path, [_run("real Director")], report=report.name, data_file=data.name)
    slow.merge_docs(
        tmp_path, [_run("simulator", seconds=160.0)], report=report.name, data_file=data.name
    )
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\n## 1. Cold start\n\nrows\n\n" + slow.SECTION_BEGIN)
    assert text.endswith(slow.SECTION_END + "\n\n## Notes\n\n- a note\n")
    assert text.count("| simulator |") == 1
    assert "| 160.0 s |" in text
    assert "| real Director |" in text
    kept = json.loads(data.read_text())
    assert (kept["runs"], kept["real_director"]) == ([1, 2], {"x": 1})
    runs = slow.from_json(kept[slow.JSON_KEY])
    assert [(r.target, r.seconds) for r in runs] == [("real Director", 170.0), ("simulator", 160.0)]
