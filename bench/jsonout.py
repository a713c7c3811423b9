"""`benchmarks.json`: every figure of the report, machine-readable, so that a run can be
checked by a program and compared across commits. Pure: a `BenchReport` in, plain JSON data
out. The shape is documented in docs/benchmarks-json.md; a unit test holds the two together.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench import report as report_mod
from bench.prometheus import KcpRequests
from bench.results import MB, BenchReport, FleetRunResult, LatencyFigures, SteadyResult

SCHEMA = 1


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _fleet_run(report: BenchReport, run: FleetRunResult) -> dict[str, Any]:
    ratio = run.ratio
    record: dict[str, Any] = {
        "scenario": run.scenario,
        "table": report_mod.table_of(report.plan, run),
        "n": run.n,
        "capacity": run.capacity,
        "latency": run.latency,
        "identity_mode": run.identity_mode,
        "replicas": run.replicas,
        "connected": run.connected,
    }
    if run.scenario == "outage":
        record["recovery_seconds"] = _r(run.recovery_seconds)
    else:
        record["seconds"] = _r(run.seconds)
    record.update(
        {
            "bound": _r(run.bound),
            "ratio": _r(ratio),
            "ratio_target": report_mod.RATIO_TARGET,
            "ratio_met": ratio is not None and ratio <= report_mod.RATIO_TARGET,
            "director_calls": dict(sorted(run.director.by_operation.items())),
            "calls_per_runtime": _r(run.calls_per_runtime),
            "calls_per_runtime_target": report_mod.CALLS_PER_RUNTIME_TARGET,
            "peak_director_in_flight": run.director.peak_in_flight,
            "director_busy_share": _r(run.director_busy),
            "duplicates": run.integrity.duplicates,
            "registrations": run.integrity.registrations,
            "mappings_recorded": run.integrity.mappings_recorded,
            "broker_cpu_seconds": _r(run.broker_cpu_seconds),
            "broker_rss_peak_mb": _r(run.broker_rss_peak_mb, 1),
            "kcp_requests": run.kcp.by_request,
            "kcp_requests_total": run.kcp.total,
            "runtime_api_requests": None if run.runtime_api is None else run.runtime_api.by_request,
            "agent_attempts": dict(sorted(run.attempts.items())),
            "cpu_seconds_by_process": {k: _r(v) for k, v in sorted(run.cpu.by_role.items())},
            "cpu_seconds_other_work": _r(run.cpu.others),
            "wall_seconds": _r(run.cpu.wall_seconds),
            "timed_out": run.timed_out,
            "deadline_seconds": _r(run.deadline_seconds),
            "profiled": run.profiled or None,
            "lost_log_records": run.lost_log_records,
            "connect_times": [round(t, 2) for t in run.connect_times],
        }
    )
    if run.scenario == "outage":
        record.update(
            {
                "outage_seconds": _r(run.outage_seconds),
                "connected_during_outage": run.connected_during_outage,
                "first_connect_after_return": _r(run.first_connect_after_return),
                "calls_during_outage": run.calls_during_outage,
                "oauth_calls_during_outage": run.oauth_calls_during_outage,
                "breaker_opened_after": _r(run.breaker_opened_after),
                "opening_burst": run.opening_burst,
                "opening_burst_rule": run.burst_rule,
                "calls_per_5s_after_open": list(run.windows_after),
                "max_calls_per_5s_after_open": run.max_calls_per_window_after,
            }
        )
    return record


def _kcp(kcp: KcpRequests | None) -> dict[str, Any]:
    if kcp is None:
        return {"kcp_requests": None, "events_created": None, "events_updated": None}
    return {
        "kcp_requests": kcp.by_request,
        "events_created": kcp.events_created,
        "events_updated": kcp.events_updated,
    }


def _steady_phase(steady: SteadyResult, phase: str, f: LatencyFigures) -> dict[str, Any]:
    return {
        "scenario": "steady",
        "phase": phase,
        "n": steady.runtimes,
        "capacity": steady.capacity,
        "latency": 0.0,
        "identity_mode": steady.identity_mode,
        "replicas": 1,
        "callers": 1 if phase == "one-caller" else steady.callers,
        "requests": f.requests,
        "answers": dict(sorted(f.statuses.items())),
        "p50_ms": _r(f.p50_ms),
        "p99_ms": _r(f.p99_ms),
        "max_ms": _r(f.max_ms),
        "overhead_p50_ms": _r(f.overhead_p50_ms),
        "overhead_p99_ms": _r(f.overhead_p99_ms),
        "seconds": _r(f.seconds),
        "answers_per_second": _r(f.answers_per_second, 1),
        "broker_cpu_seconds": _r(f.broker_cpu_seconds),
        "broker_cpu_ms_per_answer": _r(f.cpu_ms_per_answer),
        "broker_rss_peak_mb": _r(steady.broker_rss_peak_bytes / MB, 1),
        "kcp_requests_per_answer": _r(f.kcp_per_answer),
        **_kcp(f.kcp),
        "harness_cpu_seconds": _r(f.harness_cpu_seconds),
        "director_p50_ms": _r(steady.director_p50_ms),
        "director_p99_ms": _r(steady.director_p99_ms),
    }


def to_json(report: BenchReport) -> dict[str, Any]:
    runs = [_fleet_run(report, r) for r in report.runs]
    s = report.steady
    if s is not None:
        runs += [
            _steady_phase(s, "one-caller", s.single),
            _steady_phase(s, "concurrent", s.issued),
            _steady_phase(s, "breaker-open", s.rejected),
        ]
    rp = report.reports
    if rp is not None:
        runs.append(
            {
                "scenario": "reports",
                "n": rp.runtimes,
                "heartbeat_seconds": _r(rp.heartbeat_seconds),
                "window_seconds": _r(rp.window_seconds),
                "reports": rp.reports,
                "statuses": dict(rp.statuses),
                "warmup_writes": rp.warmup_writes,
                "broker_cpu_seconds": _r(rp.broker_cpu_seconds),
                "broker_cpu_share": _r(rp.cpu_share, 5),
                "kcp_writes": rp.writes,
                "kcp_writes_per_second": _r(rp.writes_per_second),
                "kcp_requests": dict(rp.kcp.by_request),
            }
        )
    fp = report.footprint
    if fp is not None:
        runs.append(
            {
                "scenario": "footprint",
                "connect_seconds": _r(fp.connect_seconds),
                "pulls": fp.pulls,
                "peak_rss_mb": _r(fp.peak_rss_bytes / MB, 1),
                "rss_end_mb": _r(fp.rss_bytes_end / MB, 1),
                "idle_seconds": _r(fp.idle_seconds),
                "idle_cpu_seconds": _r(fp.cpu_seconds),
                "idle_cpu_share": _r(fp.cpu_share, 5),
            }
        )
    m = report.machine
    profile = report.profile
    return {
        "schema": SCHEMA,
        "commit": report.commit or None,
        "uncommitted": list(report.uncommitted),
        "command": report.command,
        "started": report.started,
        "duration_seconds": _r(report.duration_seconds, 1),
        "machine": {
            "cpus": m.cpus,
            "cpu_model": m.cpu_model,
            "python": m.python,
            "platform": m.platform,
            "load_before": list(m.load_before),
            "load_after": list(m.load_after),
        },
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(report.plan).items()},
        "runs": runs,
        "profile": None
        if profile is None
        else {
            "tool": profile.tool,
            "run": profile.run,
            "samples": profile.samples,
            "top_own": [asdict(f) for f in profile.top_own],
            "top_broker": [asdict(f) for f in profile.top_broker],
            "note": profile.note,
        },
        "verdicts": [asdict(v) for v in report_mod.verdicts(report)],
        "notes": list(report.notes),
    }
