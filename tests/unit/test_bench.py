"""The pure parts of the benchmarks: bounds, percentiles, windows, /proc parsing, tokens and
the report. No processes, no network."""

from __future__ import annotations

import jwt
import pytest

from agent.outcomes import Refused, Temporary
from bench import report, stats
from bench.fleet import outcome_label
from bench.jwks_server import jwks_path, runtime_of
from bench.keys import new_runtime_keys, sign_token
from bench.procs import parse_stat_cpu, parse_status_kib
from bench.results import (
    BenchReport,
    ColdStartResult,
    DirectorCounts,
    FootprintResult,
    Integrity,
    LatencyFigures,
    Machine,
    OutageResult,
    SteadyResult,
)


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
    assert outcome_label(Temporary(reason="transport: ConnectError")) == "transport error"
    assert outcome_label(Refused(status=409, reason=prefix + "module-not-enabled")) == (
        "409 module-not-enabled"
    )


# --- the report ------------------------------------------------------------------------------


def _counts(n: int, lookups: float, peak: int = 8) -> DirectorCounts:
    return DirectorCounts(
        by_operation={
            "runtimes": int(n * lookups),
            "registerRuntime": n,
            "requestOneTimeTokenForRuntime": n,
        },
        peak_in_flight=peak,
        peak_active=peak,
    )


def _figures(p99: float, cpu: float, count: int) -> LatencyFigures:
    return LatencyFigures(
        requests=count,
        statuses={"201": count},
        p50_ms=p99 / 2,
        p99_ms=p99,
        max_ms=p99 * 1.5,
        seconds=2.0,
        broker_cpu_seconds=cpu,
        counted=count,
    )


def _report(*, recovery: float, lookups: float, p99: float, rss_mb: float) -> BenchReport:
    integrity = Integrity(
        registrations=100, distinct_runtimes=100, duplicates=0, mappings_recorded=100
    )
    r = BenchReport(
        command="python -m bench",
        machine=Machine(
            cpus=2, cpu_model="cpu", python="3.11.7", platform="Linux", load_before=(1, 1, 1)
        ),
        capacity=8,
        latency=0.05,
        outage_seconds=60,
        sizes=[100],
    )
    r.cold.append(
        ColdStartResult(
            n=100,
            capacity=8,
            latency=0.05,
            connected=100,
            seconds=1.5,
            bound=1.25,
            director=_counts(100, lookups),
            integrity=integrity,
            attempts={"201": 100, "503 compass-unavailable": 7},
            broker_cpu_seconds=3.0,
            timed_out=False,
        )
    )
    r.outage.append(
        OutageResult(
            n=100,
            capacity=8,
            latency=0.05,
            outage_seconds=60,
            connected=100,
            connected_during_outage=0,
            recovery_seconds=recovery,
            first_connect_after_return=0.5,
            bound=1.25,
            calls_during_outage=7,
            calls_first_window=5,
            max_calls_per_window_after=1,
            director_after_return=_counts(100, lookups, peak=8),
            integrity=integrity,
            attempts={"201": 100},
            broker_cpu_seconds=4.0,
            timed_out=False,
            connect_times=[61.0, 62.0],
            up_at=60.0,
        )
    )
    r.steady = SteadyResult(
        runtimes=100,
        callers=200,
        issued=_figures(p99, 1.0, 300),
        single=_figures(3.0, 0.1, 50),
        rejected=LatencyFigures(
            requests=300,
            statuses={"503": 300},
            p50_ms=2.0,
            p99_ms=4.0,
            max_ms=5.0,
            seconds=1.0,
            broker_cpu_seconds=0.15,
            counted=300,
        ),
        director_p50_ms=0.5,
        director_p99_ms=1.0,
    )
    r.footprint = FootprintResult(
        idle_seconds=60,
        cpu_seconds=0.3,
        peak_rss_bytes=int(rss_mb * 1024 * 1024),
        rss_bytes_end=int(rss_mb * 1024 * 1024),
        connect_seconds=2.0,
        pulls=1,
    )
    return r


def _status(r: BenchReport, start: str) -> str:
    matches = [v.status for v in report.verdicts(r) if v.target.startswith(start)]
    assert len(matches) == 1, start
    return matches[0]


def test_verdicts_follow_the_figures() -> None:
    good = _report(recovery=1.5, lookups=0.0, p99=8.0, rss_mb=50)
    assert _status(good, "Outage recovery") == "met"  # 1.5 / 1.25 = 1.2x
    assert _status(good, "At most 1 Director probe") == "met"
    assert _status(good, "Exactly 2 Director calls") == "met"
    assert _status(good, "Broker overhead p99") == "met"
    assert _status(good, "A 503 costs") == "met"  # 0.5 ms per 503
    assert _status(good, "Agent peak RSS") == "met"
    assert _status(good, "Agent idle CPU") == "met"  # 0.5 %

    bad = _report(recovery=2.0, lookups=2.0, p99=12.0, rss_mb=90)
    assert _status(bad, "Outage recovery") == "not met"  # 1.6x
    assert _status(bad, "Exactly 2 Director calls") == "not met"  # 4 per runtime
    assert _status(bad, "Broker overhead p99") == "not met"
    assert _status(bad, "Agent peak RSS") == "not met"


def test_missing_scenarios_are_not_measured_rather_than_met() -> None:
    r = _report(recovery=1.0, lookups=0.0, p99=1.0, rss_mb=1)
    r.outage.clear()
    r.steady = None
    r.footprint = None
    statuses = {v.target: v.status for v in report.verdicts(r)}
    assert statuses["Outage recovery and probes"] == "not measured"
    assert statuses["Broker overhead and cost of a 503"] == "not measured"
    assert statuses["Agent footprint"] == "not measured"


def test_render_has_machine_command_tables_ratios_and_findings() -> None:
    r = _report(recovery=2.0, lookups=2.0, p99=12.0, rss_mb=90)
    r.plot_file = "benchmarks-outage.png"
    r.revision = "commit abc1234 with uncommitted changes in agent"
    r.notes = report.findings(r)
    text = report.render(r)
    assert "- code measured: commit abc1234 with uncommitted changes in agent" in text
    assert "CPUs: 2" in text
    assert "Python 3.11.7" in text
    assert "`python -m bench`" in text
    assert "| 100 | 100 | 1.5 | 1.2 | 1.20x |" in text  # cold start: time, bound, ratio
    assert "1.60x" in text  # outage recovery ratio
    assert "2.00 lookup + 1.00 register + 1.00 token" in text
    assert "![Connected runtimes through the outage](benchmarks-outage.png)" in text
    assert "4.00" in text  # calls per runtime
    assert "`runtimes` queries" in text  # the lookup finding
    assert "**not met**" in text
    assert text.endswith("\n")


def test_the_reduction_note_says_why_from_the_figures() -> None:
    r = _report(recovery=2.0, lookups=2.0, p99=12.0, rss_mb=90)
    r.sizes = [100]
    note = report.reduction_note(r)
    assert note is not None
    assert "N = 100, not 5,000 (50x smaller)" in note
    assert "chosen on the command line" in note  # the cold start connected all 100
    stuck = r.cold[0]
    r.cold[0] = ColdStartResult(**{**stuck.__dict__, "connected": 8, "seconds": None})
    note = report.reduction_note(r)
    assert note is not None
    assert "already at N = 100 the broker connected only 8 of 100" in note
    r.sizes = [100, 5000]
    assert report.reduction_note(r) is None
    assert report.static_notes([100], {"BROKER_X": "1"}) == [
        "Broker settings changed for every run: `BROKER_X=1`."
    ]


def test_findings_explain_a_leaky_breaker_and_costs_that_grow_with_concurrency() -> None:
    r = _report(recovery=2.0, lookups=2.0, p99=12.0, rss_mb=90)
    assert not any("came within 5 s" in n for n in report.findings(r))
    r.outage[0] = OutageResult(**{**r.outage[0].__dict__, "max_calls_per_window_after": 100})
    assert r.steady is not None
    r.steady = SteadyResult(
        **{
            **r.steady.__dict__,
            "issued": LatencyFigures(
                **{**r.steady.issued.__dict__, "statuses": {"201": 250, "503": 50}}
            ),
        }
    )
    notes = report.findings(r)
    assert any("up to 100 came within 5 s" in n for n in notes)
    assert any("50 of 300 requests of registered runtimes got 503" in n for n in notes)
    # 1.0 CPU s / 300 tokens = 3.3 ms at 200 callers vs 0.1 / 50 = 2 ms alone: 1.67x
    assert any("3.3 ms with 200" in n for n in notes)


def test_the_opening_burst_ends_at_the_first_pause() -> None:
    burst, rest = stats.split_at_first_gap([0.0, 0.5, 3.0, 7.9, 40.0, 70.1], 5.0)
    assert burst == [0.0, 0.5, 3.0, 7.9]
    assert rest == [40.0, 70.1]
    assert stats.split_at_first_gap([1.0, 2.0], 5.0) == ([1.0, 2.0], [])
    assert stats.split_at_first_gap([], 5.0) == ([], [])
