"""bench.sessions_cut: the figures of a run, its section and JSON key merged into the docs."""

from __future__ import annotations

import json
from pathlib import Path

from bench import sessions_cut
from bench.sessions_cut import CutRun


def run(**changes: object) -> CutRun:
    base: dict[str, object] = {
        "commit": "abc1234",
        "started": "2026-12-06 22:40 UTC",
        "n": 200,
        "every": 0.5,
        "for_seconds": 20.0,
        "connected": 200,
        "seconds": 31.5,
        "rounds": 40,
        "sessions_ended": 300,
        "registrations": 200,
        "duplicates": 0,
        "director_calls": {
            "registerRuntime": 230,
            "requestOneTimeTokenForRuntime": 215,
            "runtimes": 12,
        },
        "attempts": {"201": 200, "503 compass-unavailable": 90},
    }
    base.update(changes)
    return CutRun(**base)  # type: ignore[arg-type]


def test_costs_are_per_runtime_and_met_needs_everyone_once_and_nobody_refused() -> None:
    r = run()
    assert r.calls_per_runtime == (230 + 215 + 12) / 200
    assert r.tokens_per_runtime == 215 / 200
    assert r.met
    assert not run(duplicates=1).met
    assert not run(connected=199).met
    refused = run(attempts={"201": 200, "502 compass-rejected": 3})
    assert refused.refused == 3
    assert not refused.met


def test_merge_keeps_the_rest_of_the_docs_and_the_last_five_runs(tmp_path: Path) -> None:
    md, data = tmp_path / "benchmarks.md", tmp_path / "benchmarks.json"
    md.write_text("# Benchmarks\n\n## 12. other\n\nkept\n")
    data.write_text(json.dumps({"other": {"x": 1}}))
    for i in range(7):
        sessions_cut.merge_docs(
            tmp_path, [run(commit=f"c{i}")], report="benchmarks.md", data_file="benchmarks.json"
        )
    text = md.read_text()
    assert "## 12. other\n\nkept" in text
    assert text.count(sessions_cut.SECTION_BEGIN) == 1
    assert "| c6 |" in text
    assert "| c2 |" in text
    assert "| c1 |" not in text
    # Saved again (the report is written at the end too): still one row.
    sessions_cut.merge_docs(
        tmp_path, [run(commit="c6")], report="benchmarks.md", data_file="benchmarks.json"
    )
    assert md.read_text().count("| c6 |") == 1
    saved = json.loads(data.read_text())
    assert saved["other"] == {"x": 1}
    assert [r["commit"] for r in saved[sessions_cut.JSON_KEY]["runs"]] == [
        "c2",
        "c3",
        "c4",
        "c5",
        "c6",
    ]
    assert saved[sessions_cut.JSON_KEY]["runs"][-1]["tokens_per_runtime"] == 1.075
    assert sessions_cut.from_json(saved[sessions_cut.JSON_KEY])[-1] == run(commit="c6")
