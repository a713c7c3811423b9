"""The pure pieces of `python -m bench.real` (issue 26): duplicates in Director's store, calls
per runtime, agent timeouts, the capacity bound, and how the figures reach docs/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import real
from bench.real import (
    CapacityResult,
    LostResult,
    RealColdResult,
    RealReport,
    admission_summary,
    agent_timeouts,
    call_delta,
    calls_per_runtime,
    capacity_bound,
    duplicates_by_label,
    merge_section,
    registrations_of,
)


def runtime(rid: str | None, *, as_list: bool = False) -> dict[str, object]:
    labels: dict[str, object] = {"runtimeType": "kyma"}
    if rid is not None:
        labels["kyma_runtime_id"] = [rid] if as_list else rid
    return {"id": f"id-{rid}", "labels": labels}


def test_duplicates_are_registrations_beyond_the_first_per_runtime_id() -> None:
    rows = [runtime("a"), runtime("a", as_list=True), runtime("a"), runtime("b"), runtime(None)]
    assert duplicates_by_label(rows) == 2
    assert duplicates_by_label([runtime("a"), runtime("b")]) == 0
    assert duplicates_by_label([]) == 0


def test_only_the_runs_own_runtimes_are_counted() -> None:
    rows = [runtime("a"), runtime("capacity-1"), runtime(None), runtime("b", as_list=True)]
    assert [r["id"] for r in registrations_of(rows, ["a", "b"])] == ["id-a", "id-b"]


def test_calls_are_the_difference_of_two_readings_of_every_operation() -> None:
    before = {"registerRuntime": 400, "requestOneTimeTokenForRuntime": 400}
    after = {
        "registerRuntime": 600,
        "requestOneTimeTokenForRuntime": 600,
        "runtimes": 61,
        "setRuntimeLabel": 0,
    }
    calls = call_delta(before, after)
    assert calls == {"registerRuntime": 200, "requestOneTimeTokenForRuntime": 200, "runtimes": 61}
    assert calls_per_runtime(calls, 200) == 2.305
    assert calls_per_runtime(calls, 0) is None


def test_agent_timeouts_are_the_attempts_that_ran_out_of_time() -> None:
    attempts = {"201": 1000, "transport error ReadTimeout": 4, "transport error ConnectTimeout": 1}
    assert agent_timeouts({**attempts, "503 compass-unavailable": 7}) == 5
    assert agent_timeouts({"201": 3}) == 0


def test_the_bound_is_n_over_the_pairs_director_sustains() -> None:
    assert capacity_bound(1000, 50.0) == 20.0
    assert CapacityResult(concurrency=10, pairs=400, seconds=8.0, errors=0).pairs_per_second == 50


def test_admission_gauges_are_summarised_skipping_empty_cells() -> None:
    rows = [
        {"broker_director_calls_in_flight": "10", "broker_director_calls_waiting": ""},
        {"broker_director_calls_in_flight": "6", "broker_director_calls_waiting": "3"},
    ]
    summary = admission_summary(rows)
    assert summary["broker_director_calls_in_flight"] == {"mean": 8.0, "max": 10.0}
    assert summary["broker_director_calls_waiting"] == {"mean": 3.0, "max": 3.0}
    assert "broker_event_loop_lag_seconds" not in summary


def test_the_section_goes_before_the_notes_and_is_replaced_in_place() -> None:
    text = "# Bench\n\n## 1. Cold\n\nrows\n\n## Notes\n\n- a note\n"
    once = merge_section(text, "## 11. Real\n\nfirst")
    assert once.index("## 11. Real") < once.index("## Notes")
    assert once.startswith("# Bench\n\n## 1. Cold\n\nrows\n")
    assert once.endswith("## Notes\n\n- a note\n")
    twice = merge_section(once, "## 11. Real\n\nsecond")
    assert "first" not in twice
    assert twice.count("## 11. Real") == 1
    assert twice.replace("second", "first") == once
    assert merge_section("# only\n", "## s").endswith(f"{real.SECTION_END}\n")


def a_report() -> RealReport:
    lost = LostResult(
        target="real Director",
        n=200,
        connected=200,
        seconds=12.5,
        answers_lost=61,
        registrations=200,
        duplicates=0,
        director_calls={"registerRuntime": 200, "requestOneTimeTokenForRuntime": 200},
        calls_per_runtime=2.0,
        attempts={"201": 200},
        waited_after_seconds=17.0,
    )
    cold = RealColdResult(
        n=1000,
        broker_concurrency=10,
        connected=1000,
        seconds=25.0,
        pairs_per_second=50.0,
        bound=20.0,
        attempts={"201": 1000},
        agent_timeouts=0,
        tokens_issued=1000,
        registrations=1000,
        duplicates=0,
        director_calls={"registerRuntime": 1000, "requestOneTimeTokenForRuntime": 1000},
        calls_per_runtime=2.0,
        cpu_seconds_by_process={"director": 30.0},
        wall_seconds=26.0,
    )
    return RealReport(
        command="python -m bench.real",
        commit="abc1234",
        started="2026-12-06 05:00 UTC",
        load_before=(1.0, 1.0, 1.0),
        lost=[lost],
        capacity=[CapacityResult(concurrency=10, pairs=400, seconds=8.0, errors=0)],
        cold=cold,
    )


def test_the_figures_reach_the_docs_without_touching_the_rest(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text("# Bench\n\n## Notes\n\n- n\n")
    (tmp_path / "benchmarks.json").write_text(json.dumps({"schema": 1, "runs": []}))
    real.merge_into_docs(a_report(), tmp_path)
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert data["schema"] == 1
    assert data["runs"] == []
    figures = data[real.JSON_KEY]
    assert figures["commit"] == "abc1234"
    assert figures["cold"]["ratio"] == 1.25
    assert figures["cold"]["ratio_met"] is True
    assert figures["lost"][0]["met"] is True
    assert figures["capacity"][0]["pairs_per_second"] == 50.0
    md = (tmp_path / "benchmarks.md").read_text()
    assert "| time to all connected | 25.0 s (bound 20.0 s, 1.25x) | ≤ 1.25x | yes |" in md
    assert md.endswith("## Notes\n\n- n\n")


def test_losses_are_spread_one_in_every_three_and_a_third_registrations() -> None:
    due = [real.losses_due(seen, 0.3, 60) for seen in (0, 3, 4, 10, 199, 1000)]
    assert due == [1, 1, 2, 4, 60, 60]


def test_a_full_bench_run_keeps_the_real_director_figures(tmp_path: Path) -> None:
    from bench.__main__ import keep_real_director  # noqa: PLC0415

    (tmp_path / "benchmarks.md").write_text("# Bench\n\n## Notes\n\n- n\n")
    (tmp_path / "benchmarks.json").write_text(json.dumps({"schema": 1, "runs": []}))
    real.merge_into_docs(a_report(), tmp_path)
    text, data = keep_real_director(tmp_path, "# New\n\n## Notes\n\n- m\n", {"schema": 1})
    assert data[real.JSON_KEY]["commit"] == "abc1234"
    assert "## 11. Against the real Compass Director" in text
    assert text.startswith("# New\n")
    assert text.endswith("## Notes\n\n- m\n")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert keep_real_director(fresh, "# New\n", {"schema": 1}) == ("# New\n", {"schema": 1})


def test_quartiles_are_the_moments_a_quarter_half_three_quarters_and_all_connected() -> None:
    times = [float(t) for t in range(1, 9)]
    assert real.quartiles(times, 8) == [2.0, 4.0, 6.0, 8.0]
    assert real.quartiles(times[:5], 8) == [2.0, 4.0, None, None]


def test_postgres_backends_count_as_one_program() -> None:
    roles = {
        "broker": 9.04,
        "postgres: postgres compass 127.0.0.1(1) idle": 1.0,
        "postgres: postgres compass 127.0.0.1(2) idle": 0.55,
        "postgres": 0.1,
    }
    assert real.cpu_by_program(roles) == {"broker": 9.0, "postgres": 1.7}


def test_director_gets_the_lowest_cpu_and_the_others_the_rest() -> None:
    assert real.split_cpus({0, 1}, "auto") == ({0}, {1})
    assert real.split_cpus({2, 3, 5}, "auto") == ({2}, {3, 5})
    assert real.split_cpus({0}, "auto") is None  # one CPU: nothing to separate
    assert real.split_cpus({0, 1}, "none") is None
    assert real.split_cpus({0, 1, 2, 3}, "1/0,2-3") == ({1}, {0, 2, 3})
    for bad in ("0", "0/0", "0/4", "x/1"):
        with pytest.raises(ValueError):
            real.split_cpus({0, 1, 2, 3}, bad)


def test_each_cpu_is_busy_for_what_is_neither_idle_nor_iowait() -> None:
    stat = (
        "cpu  300 0 100 900 100 0 0 0 0 0\n"
        "cpu0 200 0 50 400 50 0 0 0 0 0\n"
        "cpu1 100 0 50 500 50 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    before = real.busy_per_cpu(stat, ticks=100)
    assert before == {0: 2.5, 1: 1.5}
    after = {0: 2.5 + 9.0, 1: 1.5 + 2.5}
    assert real.busy_shares(before, after, 10.0) == {"cpu0": 0.9, "cpu1": 0.25}
    assert real.busy_shares(before, {0: 20.0, 1: 1.0}, 10.0) == {"cpu0": 1.0, "cpu1": 0.0}


def test_others_cpu_is_the_machine_less_the_bench_processes() -> None:
    assert real.others_cpu(30.0, {"broker": 10.0, "director": 12.5}) == 7.5
    assert real.others_cpu(10.0, {"broker": 10.5}) == 0.0


def test_the_placement_and_each_cores_load_are_in_the_report() -> None:
    report = a_report()
    report.cpus = {"Director, PostgreSQL, gateway": "0", "bench, KCP API server, broker": "1"}
    report.capacity[0].cpu_busy = {"cpu0": 0.97, "cpu1": 0.41}
    report.capacity[0].others_cpu_seconds = 0.4
    report.capacity[0].load_after = 2.5
    md = real.render(report)
    assert "Director, PostgreSQL, gateway on CPU 0; bench, KCP API server, broker on CPU 1" in md
    assert "| 10 | pair | 400 | 8.0 | 50.0 | 100.0 | 0 | cpu0 97 % / cpu1 41 % | 0.4 | 2.50 |" in md
    assert real.to_json(report)["cpus"] == report.cpus


def test_the_cold_start_is_also_held_to_the_calls_the_broker_made() -> None:
    report = a_report()
    report.capacity.append(
        CapacityResult(concurrency=10, pairs=400, seconds=16.0, errors=0, lookups=2)
    )
    assert report.cold is not None
    report.cold.same_calls_bound = capacity_bound(1000, report.capacity[-1].pairs_per_second)
    assert report.cold.same_calls_ratio == 25.0 / 40.0
    md = real.render(report)
    assert "| 10 | 2 look-ups + pair | 400 | 16.0 | 25.0 | 100.0 | 0 |" in md
    assert "| against Director's time for the calls the broker made | 0.62x (bound 40.0 s)" in md
    assert real.to_json(report)["cold"]["same_calls_ratio"] == 0.625
    report.cold.same_calls_bound = None
    assert "calls the broker made" not in real.render(report)


def test_lost_figures_not_measured_again_are_kept_with_the_commit_they_were_measured_at(
    tmp_path: Path,
) -> None:
    first = a_report()
    data = real.to_json(first)
    lost, measured = real.kept_lost(data)
    assert lost == first.lost
    assert measured == "abc1234, 2026-12-06 05:00 UTC"
    again = a_report()
    again.lost, again.lost_from = lost, measured
    kept = real.to_json(again)
    assert kept["lost"] == data["lost"]
    assert real.kept_lost(kept) == (lost, measured)  # carried on as often as it is not re-run
    assert "Not re-run: measured at commit abc1234, 2026-12-06 05:00 UTC." in real.render(again)
    assert real.kept_lost(None) == ([], "")
    assert real.kept_lost({"commit": "x", "lost": []}) == ([], "")


def ab_data(seconds: float | None, *, deferred: int = 0, timeouts: int = 0) -> dict[str, object]:
    report = a_report()
    assert report.cold is not None
    report.cold.seconds = seconds
    report.cold.attempts = {"201": 1000, "503 capacity-booked": deferred} if deferred else {}
    report.cold.agent_timeouts = timeouts
    return json.loads(json.dumps(real.to_json(report)))


def test_interleaved_runs_are_compared_by_median_and_worst_ratio() -> None:
    runs = [
        real.ab_run("old", ab_data(30.0, timeouts=12)),
        real.ab_run("new", ab_data(24.0, deferred=600)),
        real.ab_run("old", ab_data(22.0)),
        real.ab_run("new", ab_data(None, deferred=5)),  # never finished: counts as the worst
        real.ab_run("old", ab_data(25.0)),
    ]
    assert runs[0].ratio == 1.5  # bound 20 s
    medians = real.ab_medians(runs)
    assert list(medians) == ["old", "new"]
    assert medians["old"] == {
        "runs": 3,
        "median_seconds": 25.0,
        "median_ratio": 1.25,
        "worst_ratio": 1.5,
        "deferred": 0,
        "agent_timeouts": 12,
        "met": 2,
    }
    assert medians["new"]["median_seconds"] is None
    assert medians["new"]["worst_ratio"] is None
    assert medians["new"]["deferred"] == 605
    report = a_report()
    report.ab, report.finding = runs, "**Finding.** old wins."
    text = real.render(report)
    assert "| 2 | new | `abc1234` | 2026-12-06 05:00 UTC | 1.00 → — | — | 50.0 | 24.0 s |" in text
    assert "| old | 3 | 25.0 s | 1.25x | 1.50x | 2 | 0 | 12 |" in text
    assert text.index("### Interleaved runs") < text.index("**Finding.** old wins.")
    saved = real.to_json(report)
    assert saved["finding"] == "**Finding.** old wins."
    assert saved["ab"][0]["variant"] == "old"
    assert saved["ab_medians"]["old"]["median_ratio"] == 1.25


def test_the_sections_are_rendered_again_from_the_json_alone(tmp_path: Path) -> None:
    report = a_report()
    report.ab = [real.ab_run("old", ab_data(30.0)), real.ab_run("new", ab_data(24.0))]
    report.lost_from, report.cpus = "abc1234", {"Director": "0"}
    report.finding = "**Finding.** old story."
    saved = json.loads(json.dumps(real.to_json(report)))
    assert real.from_json(saved) == report
    (tmp_path / "benchmarks.md").write_text("# Bench\n\n## Notes\n\n- n\n")
    (tmp_path / "benchmarks.json").write_text(json.dumps({"schema": 1, real.JSON_KEY: saved}))
    real.render_docs(tmp_path, "**Finding.** a summary, [0016](design/0016-x.md).")
    md = (tmp_path / "benchmarks.md").read_text()
    assert "**Finding.** a summary" in md
    assert "old story" not in md
    assert "| time to all connected | 25.0 s (bound 20.0 s, 1.25x) | ≤ 1.25x | yes |" in md
    assert md.endswith("## Notes\n\n- n\n")
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert data[real.JSON_KEY]["finding"].startswith("**Finding.** a summary")
    assert data[real.JSON_KEY]["cold"] == saved["cold"]
