"""The pure parts of the benchmarks: bounds, percentiles, windows, /proc and metrics parsing,
the plan of runs, profiles, tokens, the report and the JSON. No processes, no network."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
from dataclasses import replace
from pathlib import Path

import jwt
import pytest

from agent.outcomes import Refused, Temporary
from bench import report, stats
from bench.fleet import assign_brokers, outcome_label, split_evenly
from bench.jsonout import to_json
from bench.jwks_server import jwks_path, runtime_of
from bench.keys import new_runtime_keys, sign_token
from bench.plan import RunSpec, deadline, fleet_runs
from bench.procs import (
    CpuSnapshot,
    cpu_by_role,
    parse_machine_busy,
    parse_stat_cpu,
    parse_status_kib,
    process_role,
    run_until_stopped,
)
from bench.profiling import ProfileSummary, frame_name, profiled_run, summarise_collapsed
from bench.prometheus import (
    KcpRequests,
    delta,
    parse_request_counts,
    unlabelled_samples,
)
from bench.scenarios import (
    ADMISSION_GAUGES,
    BREAKER_GAUGE,
    BREAKER_OPENED_GAUGE,
    admission_row,
    breaker_opened_at,
)
from tests.unit.bench_fixtures import a_report, a_run


def test_capacity_bound_is_n_times_calls_times_latency_over_capacity() -> None:
    assert stats.capacity_bound(5000, latency=0.05, capacity=8) == pytest.approx(62.5)
    assert stats.capacity_bound(100, latency=0.1, capacity=4, calls_per_runtime=4) == 10.0
    assert stats.capacity_bound(0, latency=1, capacity=1) == 0
    with pytest.raises(ValueError):
        stats.capacity_bound(10, latency=0.1, capacity=0)


def test_ratio_needs_a_value_and_a_positive_bound() -> None:
    assert stats.ratio(15.0, 10.0) == 1.5
    assert stats.ratio(None, 10.0) is None
    assert stats.ratio(3.0, 0.0) is None


def test_director_busy_is_the_share_of_capacity_times_time_the_calls_used() -> None:
    # 2 calls of L per runtime take exactly the bound at full use; 1.25x the bound is 80 %.
    assert a_run(scenario="cold", n=1000, ratio=1.25).director_busy == pytest.approx(0.8)
    assert a_run(scenario="outage", n=1000, ratio=1.0).director_busy == pytest.approx(1.0)
    assert a_run(scenario="cold", n=1000, ratio=1.0, connected=999).director_busy is None


def test_percentile_interpolates_like_numpy_linear() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert stats.percentile(values, 0) == 15.0
    assert stats.percentile(values, 100) == 50.0
    assert stats.percentile(values, 50) == 35.0
    assert stats.percentile(values, 40) == pytest.approx(29.0)  # numpy: 29.0
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert stats.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_window_counts_and_sliding_maximum() -> None:
    times = [0.0, 1.0, 4.9, 5.0, 12.0, 99.0]
    assert stats.window_counts(times, start=0.0, end=15.0, width=5.0) == [3, 1, 1]
    assert stats.max_in_sliding_window([0.0, 1.0, 4.9, 5.0, 12.0], 5.0) == 3
    assert stats.max_in_sliding_window([0.0, 5.0, 10.0], 5.0) == 1
    assert stats.max_in_sliding_window([], 5.0) == 0


def test_duplicates_count_registrations_beyond_the_first() -> None:
    assert stats.duplicate_registrations(["a", "b", "c"]) == 0
    assert stats.duplicate_registrations(["a", "a", "b", "a"]) == 2


def test_completion_time_waits_for_the_expected_count() -> None:
    assert stats.completion_time([12.0, 10.5, 11.0], since=10.0, expected=3) == 2.0
    assert stats.completion_time([12.0], since=10.0, expected=2) is None
    xs, ys = stats.cumulative([3.0, 1.0], since=1.0)
    assert (xs, ys) == ([0.0, 2.0], [1, 2])


def test_proc_parsing_handles_spaces_and_parentheses_in_the_command() -> None:
    # pid (comm) state ppid ... utime(14) stime(15)
    fields = ["S", "1"] + ["0"] * 9 + ["250", "150"] + ["0"] * 30
    stat = "1234 (python (odd) name) " + " ".join(fields)
    assert parse_stat_cpu(stat, ticks=100) == pytest.approx(4.0)
    status = "Name:\tpython\nVmHWM:\t  81920 kB\nVmRSS:\t   40960 kB\n"
    assert parse_status_kib(status, "VmRSS") == 40960 * 1024
    assert parse_status_kib(status, "VmHWM") == 81920 * 1024
    assert parse_status_kib(status, "VmSwap") == 0


def test_tokens_verify_only_with_their_own_runtime_key() -> None:
    first, second = new_runtime_keys(2)
    issuer = f"http://127.0.0.1:1/rt/{first.runtime_id}"
    token = sign_token(first, issuer=issuer, now=1_000_000, lifetime=600)
    header = jwt.get_unverified_header(token)
    assert header["kid"] == first.kid
    assert header["alg"] == "ES256"
    key = jwt.PyJWK.from_dict(first.public_jwk())
    claims = jwt.decode(
        token,
        key=key.key,
        algorithms=["ES256"],
        audience="compass-broker",
        issuer=issuer,
        options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
    )
    assert claims["sub"] == "system:serviceaccount:kyma-system:compass-agent"
    assert claims["exp"] - claims["iat"] == 600
    other = jwt.PyJWK.from_dict(second.public_jwk())
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, key=other.key, algorithms=["ES256"], options={"verify_aud": False})


def test_jwks_paths_round_trip() -> None:
    assert runtime_of(jwks_path("ABC-1")) == "ABC-1"
    assert runtime_of("/rt//openid/v1/jwks") is None
    assert runtime_of("/rt/a/b/openid/v1/jwks") is None
    assert runtime_of("/other") is None


def test_outcome_labels_name_status_and_problem_type() -> None:
    prefix = "urn:kyma-compass-pull:broker:problem:"
    assert outcome_label(Temporary(reason=prefix + "compass-unavailable", status=503)) == (
        "503 compass-unavailable"
    )
    assert (
        outcome_label(Temporary(reason="transport: ConnectError")) == "transport error ConnectError"
    )
    assert outcome_label(Temporary(reason="transport")) == "transport error"
    assert outcome_label(Refused(status=409, reason=prefix + "module-not-enabled")) == (
        "409 module-not-enabled"
    )


# --- readings -------------------------------------------------------------------------------


def test_machine_busy_time_leaves_out_idle_and_iowait() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  100 5 50 1000 40 3 2 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n"
    assert parse_machine_busy(stat, ticks=100) == pytest.approx((100 + 5 + 50 + 3 + 2) / 100)
    with pytest.raises(ValueError):
        parse_machine_busy("intr 1 2 3\n")


def test_processes_are_named_by_their_role() -> None:
    py = "/venv/bin/python"
    assert process_role([py, "-m", "control_plane_broker"]) == "broker"
    assert process_role([py, "-m", "cProfile", "-o", "x", "-m", "control_plane_broker"]) == (
        "broker"
    )
    assert process_role([py, "-m", "bench.fleet", "job.json"]) == "fleet"
    assert process_role([py, "-m", "devenv.compass_sim", "--client-id", "x"]) == "compass-sim"
    assert process_role(["/cache/bin/kube-apiserver", "--etcd-servers=x"]) == "kube-apiserver"
    assert process_role(["/cache/bin/etcd", "--name=x"]) == "etcd"
    assert process_role(["/usr/bin/sleep", "5"]) == "sleep"
    assert process_role([]) == "other"


def test_cpu_by_role_counts_new_processes_from_zero_and_adds_self_reports() -> None:
    before = CpuSnapshot(at=0, machine_busy=10, own=1.0, by_pid={1: ("broker", 5.0)})
    after = CpuSnapshot(
        at=10, machine_busy=25, own=1.5, by_pid={1: ("broker", 9.0), 2: ("etcd", 0.5)}
    )
    roles = cpu_by_role(before, after, extra={"fleet": 3.0})
    assert roles == {"bench (harness)": 0.5, "broker": 4.0, "etcd": 0.5, "fleet": 3.0}


def _sample(verb: str, resource: str, value: int, *, sub: str = "", code: str = "200") -> str:
    group = "operator.kyma-project.io" if resource.startswith("compass") else ""
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="{group}",'
        f'resource="{resource}",scope="resource",subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


APISERVER_METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        _sample("GET", "compassmanagermappings", 7),
        _sample("GET", "compassmanagermappings", 3, code="404"),
        _sample("PATCH", "compassmanagermappings", 4, sub="status"),
        _sample("POST", "events", 2, code="201"),
        _sample("PATCH", "events", 5),
        _sample("GET", "", 9, sub="/metrics"),  # a non-resource URL
        'apiserver_request_total_other{verb="GET",resource="x"} 100',
        'apiserver_current_inflight_requests{request_kind="mutating"} 0',
    ]
)


def test_apiserver_request_counts_by_verb_and_resource_without_non_resource_urls() -> None:
    counts = parse_request_counts(APISERVER_METRICS)
    assert counts == {
        "GET compassmanagermappings": 10,
        "PATCH compassmanagermappings/status": 4,
        "POST events": 2,
        "PATCH events": 5,
    }
    before = {"GET compassmanagermappings": 4, "POST events": 2}
    assert delta(before, counts) == {
        "GET compassmanagermappings": 6,
        "PATCH compassmanagermappings/status": 4,
        "PATCH events": 5,
    }
    kcp = KcpRequests(delta(before, counts))
    assert kcp.total == 15
    assert (kcp.events_created, kcp.events_updated) == (0, 5)


def test_one_scrape_yields_every_unlabelled_sample_and_skips_the_rest() -> None:
    text = (
        "# HELP broker_director_calls_in_flight x\n"
        "# TYPE broker_director_calls_in_flight gauge\n"
        "broker_director_calls_in_flight 3.0\n"
        'broker_requests_total{code="201"} 7\n'
        "broker_event_loop_lag_seconds NaN\n"
        "broken_sample not-a-number\n"
        "broker_director_calls_in_flight 9.0\n"
    )
    samples = unlabelled_samples(text)
    assert samples["broker_director_calls_in_flight"] == 3.0  # the first one counts
    assert "broker_requests_total" not in samples
    assert "broken_sample" not in samples
    assert math.isnan(samples["broker_event_loop_lag_seconds"])
    assert "#" not in samples
    assert samples.get("missing") is None


def test_breaker_opened_at_takes_the_first_open_brokers_own_moment() -> None:
    closed = {BREAKER_GAUGE: 0.0, BREAKER_OPENED_GAUGE: 90.0}
    opened = {BREAKER_GAUGE: 1.0, BREAKER_OPENED_GAUGE: 95.0}
    assert breaker_opened_at([closed], now=100.0) is None
    assert breaker_opened_at([], now=100.0) is None
    assert breaker_opened_at([closed, opened], now=100.0) == 95.0
    # No moment, or one the poll has not reached yet: the poll's own time.
    assert breaker_opened_at([{BREAKER_GAUGE: 1.0}], now=100.0) == 100.0
    assert breaker_opened_at([{BREAKER_GAUGE: 1.0, BREAKER_OPENED_GAUGE: 1e12}], now=100.0) == 100.0


def test_admission_row_keeps_the_columns_when_gauges_are_missing() -> None:
    row = admission_row({ADMISSION_GAUGES[0]: 4.0, ADMISSION_GAUGES[-1]: 0.25}, now=12.34)
    cells = row.split(",")
    assert len(cells) == 1 + len(ADMISSION_GAUGES)
    assert cells[:2] == ["12.3", "4"]
    assert cells[-1] == "0.25"
    assert cells[2:-1] == [""] * (len(ADMISSION_GAUGES) - 2)


def test_collapsed_stacks_give_own_time_and_the_innermost_broker_frame() -> None:
    stacks = (
        "<module> (runpy.py:1);run (/repo/control_plane_broker/api/app.py:10);"
        "_assign (/venv/lib/python3.11/site-packages/httpcore/_pool.py:228) 60\n"
        "<module> (runpy.py:1);run (/repo/control_plane_broker/api/app.py:12);"
        "_assign (/venv/lib/python3.11/site-packages/httpcore/_pool.py:230) 20\n"
        "<module> (runpy.py:1);select (/usr/lib/python3.11/selectors.py:468) 20\n"
        "garbage line\n"
    )
    samples, own, ours = summarise_collapsed(stacks)
    assert samples == 100
    assert [(f.frame, f.share) for f in own] == [
        ("_assign (httpcore/_pool.py)", 0.8),
        ("select (selectors.py)", 0.2),
    ]
    assert [(f.frame, f.share) for f in ours] == [("run (api/app.py)", 0.8)]
    assert summarise_collapsed("") == (0, [], [])
    assert frame_name("f (/a/b/c.py:3)") == "f (b/c.py)"


# --- the plan of runs ---------------------------------------------------------------------------


def test_the_plan_runs_small_sizes_first_shares_rows_and_profiles_the_largest_cold_start() -> None:
    plan = a_report().plan
    runs = fleet_runs(plan, ("cold", "outage", "legacy", "identity", "replicas"), profile=True)
    labels = [r.label for r in runs]
    assert labels == [
        "cold N=100 L=100ms",
        "outage N=100 L=100ms",
        "cold N=1,000 L=100ms",
        "outage N=1,000 L=100ms",
        "cold N=100 L=50ms",
        "outage N=100 L=50ms",
        "cold N=1,000 L=100ms, tokenreview",
        "cold N=1,000 L=100ms, 2 replicas",
        "cold N=1,000 L=100ms, profiled",  # a repeat of its own: no table figure under py-spy
    ]
    assert [r.label for r in runs if r.profile] == ["cold N=1,000 L=100ms, profiled"]
    only_identity = fleet_runs(plan, ("identity",))
    assert [r.identity_mode for r in only_identity] == ["jwks", "tokenreview"]


def test_the_profiled_repeat_names_its_own_figures_in_the_summary() -> None:
    summary = ProfileSummary(
        tool="py-spy", run="cold N=1,000 L=100ms, profiled", samples=9, top_own=[]
    )
    named = profiled_run(summary, a_run(scenario="cold", n=1000, ratio=1.5))
    assert named.run == (
        "cold N=1,000 L=100ms, profiled (a repeat of its own, not in the tables: "
        "1,000/1,000 connected in 37.5 s, 1.50x the bound)"
    )
    unfinished = profiled_run(summary, a_run(scenario="cold", n=1000, ratio=1.5, connected=7))
    assert unfinished.run.endswith("not in the tables: 7/1,000 connected)")


def test_deadline_is_ten_bounds_at_least_300_s_capped_and_an_outage_adds_t() -> None:
    plan = a_report().plan  # C = 8, L = 0.1, T = 60, cap 1800
    assert deadline(plan, RunSpec("cold", 100, 0.1)) == 300.0
    assert deadline(plan, RunSpec("cold", 5000, 0.1)) == 1250.0
    assert deadline(plan, RunSpec("outage", 5000, 0.1)) == 1310.0
    assert deadline(plan, RunSpec("cold", 100_000, 0.1)) == 1800.0


def test_agents_are_spread_round_robin_over_replicas_and_processes() -> None:
    assert assign_brokers(["a", "b", "c", "d", "e"], 2) == [0, 1, 0, 1, 0]
    assert assign_brokers(["a", "b"], 1) == [0, 0]
    with pytest.raises(ValueError):
        assign_brokers(["a"], 0)
    assert split_evenly([1, 2, 3, 4, 5], 2) == [[1, 3, 5], [2, 4]]
    assert split_evenly([1], 3) == [[1]]


# --- the report ------------------------------------------------------------------------------


def _status(r: object, start: str) -> str:
    matches = [v.status for v in report.verdicts(r) if v.target.startswith(start)]  # type: ignore[arg-type]
    assert len(matches) == 1, (start, [v.target for v in report.verdicts(r)])  # type: ignore[arg-type]
    return matches[0]


def test_verdicts_follow_the_figures() -> None:
    good = a_report(ratio=1.2, calls=2.0, overhead_p99=8.0, rss_mb=50, window=1)
    assert _status(good, "Cold start N = 1,000") == "met"
    assert _status(good, "Outage recovery N = 1,000") == "met"
    assert _status(good, "≤ 2.05 Director calls") == "met"
    assert _status(good, "Outage: ≤ 1 call") == "met"
    assert _status(good, "Steady, one caller") == "met"
    assert _status(good, "Steady, 200 concurrent callers: ≥ 300") == "met"
    assert _status(good, "Steady, 200 concurrent callers: 0 answers") == "met"
    assert _status(good, "Broker CPU per token") == "met"
    assert _status(good, "Broker CPU per 503") == "met"
    assert _status(good, "KCP requests per token") == "met"
    assert _status(good, "Identity mode `tokenreview`") == "met"
    assert _status(good, "2 broker replicas") == "met"
    assert _status(good, "Agent peak RSS") == "met"
    assert _status(good, "Cold start N = 5,000") == "not measured"  # not in this run
    assert _status(good, "Broker peak RSS at N = 5,000") == "not measured"

    assert _status(good, "Connection reports (issue 13), N = 5,000") == "met"  # 2 %, 1.4/s
    assert _status(a_report(report_cpu=3.1), "Connection reports") == "not met"  # 5.2 %
    assert _status(a_report(report_writes=121), "Connection reports") == "not met"  # 2.02/s

    bad = a_report(ratio=1.3, calls=2.1, overhead_p99=12.0, rss_mb=90, window=2)
    assert _status(bad, "Cold start N = 1,000") == "not met"
    assert _status(bad, "Outage recovery N = 1,000") == "not met"
    assert _status(bad, "≤ 2.05 Director calls") == "not met"
    assert _status(bad, "Outage: ≤ 1 call") == "not met"
    assert _status(bad, "Steady, one caller") == "not met"
    assert _status(bad, "Agent peak RSS") == "not met"


def test_a_run_that_did_not_connect_everyone_or_made_duplicates_is_not_met() -> None:
    r = a_report()
    r.runs[0] = a_run(scenario="cold", n=1000, ratio=1.0, connected=999)
    assert _status(r, "Cold start N = 1,000") == "not met"
    r.runs[0] = a_run(scenario="cold", n=1000, ratio=1.0, duplicates=1)
    assert _status(r, "Cold start N = 1,000") == "not met"


def test_fleets_below_the_issue_sizes_are_reference_rows_not_targets() -> None:
    r = a_report()
    r.runs.append(a_run(scenario="cold", n=100, ratio=1.4))
    targets = [v.target for v in report.verdicts(r)]
    assert not any(t.startswith("Cold start N = 100 ") for t in targets)
    assert _status(r, "Cold start N = 1,000") == "met"
    text = report.render(r)
    assert "| 100 | 100 | 3.5 | 2.5 | 1.40x | 2.00 |" in text
    assert "| 1,000 | 1,000 | 30.0 | 25.0 | 1.20x | 2.00 |" in text


def test_missing_scenarios_are_not_measured_rather_than_met() -> None:
    r = a_report()
    r.runs.clear()
    r.steady = None
    r.reports = None
    r.footprint = None
    statuses = {v.target: v.status for v in report.verdicts(r)}
    assert statuses["Steady state (registered runtimes, Director answering at once)"] == (
        "not measured"
    )
    assert statuses["Identity mode `tokenreview`, cold start"] == "not measured"
    assert statuses["Two broker replicas share a cold start"] == "not measured"
    assert statuses["Agent footprint"] == "not measured"
    assert all(v.status == "not measured" for v in report.verdicts(r))


def test_render_has_machine_command_every_table_and_findings() -> None:
    r = a_report(ratio=1.3, calls=4.0, overhead_p99=12.0, rss_mb=90, window=2)
    r.plots = {"cold": "benchmarks-cold.png", "outage": "benchmarks-outage.png"}
    r.commit, r.uncommitted = "abc1234", ["agent"]
    r.notes = report.findings(r)
    text = report.render(r)
    assert "- code measured: commit abc1234 with uncommitted changes in agent" in text
    assert "CPUs: 2" in text
    assert "`make bench`" in text
    # cold start row: N, connected, time, bound, ratio, calls per new runtime
    assert "| 1,000 | 1,000 | 32.5 | 25.0 | 1.30x | 4.00 |" in text
    assert "2.00 `runtimes` lookups per new runtime" in text
    assert "![Connected runtimes through the outage](benchmarks-outage.png)" in text
    assert "| tokenreview | 1 | 1,000 |" in text
    assert "| jwks | 2 | 1,000 |" in text
    assert "## 7. Who used the cores" in text
    assert "`runtimes` lookups per new runtime" in text
    assert "Events created 0, aggregated into existing ones 300" in text
    assert "**not met**" in text
    assert text.endswith("\n")


def test_findings_name_a_busy_fleet_and_answers_other_than_201() -> None:
    r = a_report()
    assert not any("sending side" in n for n in report.findings(r))
    r.runs[0] = a_run(scenario="cold", n=1000, ratio=1.0, fleet_cpu=30.0)  # 32 s wall
    assert r.steady is not None
    issued = r.steady.issued
    r.steady = replace(r.steady, issued=replace(issued, statuses={"201": 250, "503": 50}))
    notes = report.findings(r)
    assert any("the fleet used 94% of a core" in n for n in notes)
    assert any(
        "50 of 300 requests of registered runtimes were not answered 201" in n for n in notes
    )


def test_the_opening_burst_ends_at_the_first_pause() -> None:
    burst, rest = stats.split_at_first_gap([0.0, 0.5, 3.0, 7.9, 40.0, 70.1], 5.0)
    assert burst == [0.0, 0.5, 3.0, 7.9]
    assert rest == [40.0, 70.1]
    assert stats.split_at_first_gap([1.0, 2.0], 5.0) == ([1.0, 2.0], [])
    assert stats.split_at_first_gap([], 5.0) == ([], [])
    assert stats.split_at([3.0, 1.0, 2.0], 2.0) == ([1.0], [2.0, 3.0])


# --- the JSON ----------------------------------------------------------------------------------

JSON_DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks-json.md"


def documented_keys() -> dict[str, list[str]]:
    """Section title -> the keys of its table, in docs/benchmarks-json.md: every code span of
    a row's first cell (a row may name several keys that mean the same)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in JSON_DOC.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current and line.startswith("| `"):
            sections[current].extend(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return sections


def test_the_json_has_exactly_the_documented_shape() -> None:
    doc = documented_keys()
    data = to_json(a_report())
    assert list(data) == doc["Top level"]
    by_scenario: dict[str, list[dict[str, object]]] = {}
    for run in data["runs"]:
        by_scenario.setdefault(str(run["scenario"]), []).append(run)
    assert set(by_scenario) == {"cold", "outage", "steady", "reports", "footprint"}
    for scenario, records in by_scenario.items():
        expected = doc[f"Runs with `scenario` = `{scenario}`"]
        for record in records:
            assert sorted(record) == sorted(expected), scenario
    cold = next(r for r in by_scenario["cold"] if r["table"] == "primary")
    assert cold["seconds"] == 30.0
    assert cold["bound"] == 25.0
    assert cold["ratio"] == 1.2
    assert cold["director_calls"] == {
        "registerRuntime": 1000,
        "requestOneTimeTokenForRuntime": 1000,
        "runtimes": 0,
    }
    assert cold["calls_per_runtime"] == 2.0
    assert cold["identity_mode"] == "jwks"
    assert cold["replicas"] == 1
    assert {r["table"] for r in by_scenario["cold"]} == {"primary", "identity", "replicas"}
    outage = by_scenario["outage"][0]
    assert outage["recovery_seconds"] == 30.0
    assert "seconds" not in outage
    assert outage["calls_per_5s_after_open"] == [1, 0, 1]
    assert {r["phase"] for r in by_scenario["steady"]} == {
        "one-caller",
        "concurrent",
        "breaker-open",
    }
    (reports,) = by_scenario["reports"]
    assert reports["kcp_writes"] == 84
    assert reports["kcp_writes_per_second"] == 1.4
    assert reports["broker_cpu_share"] == 0.02
    assert data["commit"] == "abc1234"
    json.dumps(data)  # plain JSON all the way down


def test_calls_per_window_repeat_a_value_once_with_its_count() -> None:
    r = a_report()
    outage = next(run for run in r.runs if run.scenario == "outage")
    r.runs[r.runs.index(outage)] = replace(outage, windows_after=[0, 1, 1, 1, 0, 2, 2])
    assert "| 0 1x3 0 2x2 |" in report.render(r)


def test_a_run_whose_201s_are_not_its_connected_runtimes_is_named() -> None:
    r = a_report()
    assert not any("answers 201" in n for n in report.findings(r))
    cold = r.runs[0]
    r.runs[0] = replace(cold, attempts={**cold.attempts, "201": cold.connected + 3})
    assert any(f"{cold.connected + 3:,} answers 201 for" in n for n in report.findings(r))


def test_the_recorded_command_names_no_folder_of_this_machine() -> None:
    command = report.recorded_command(
        "python -m bench.real",
        ["--docs", "--out-dir", "/tmp/s46/docsrun", "--ab", "64=/tmp/s45/d1", "--n", "1000"],
    )
    assert command == (
        "python -m bench.real --docs --out-dir runs/docsrun --ab 64=runs/d1 --n 1000"
    )
    assert "'a b'" in report.recorded_command("p", ["a b"])  # still a command a shell can run


def test_sigterm_stops_a_run_through_its_teardown() -> None:
    """A stopped run unwinds like Ctrl-C: what it started is stopped on the way out."""
    torn_down: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    async def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            torn_down.append("stacks stopped")

    assert run_until_stopped(run()) is False
    assert torn_down == ["stacks stopped"]

    async def finishes() -> None:
        await asyncio.sleep(0)

    assert run_until_stopped(finishes()) is True
    assert signal.getsignal(signal.SIGTERM) is before  # the test run's own handler is back
