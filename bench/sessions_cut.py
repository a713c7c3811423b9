"""The session-cut scenario (issue 40, item 4): what an uncertain answer costs.

A cold start of N runtimes through one broker against the real Director while, once a quarter
of the fleet is registered, every database session Director holds is ended every `every` s for
`for_seconds` s (a failover, a restarted pooler). Director then answers some writing calls with
code 10 although it committed them (`control_plane_broker.director.classification`), and the
broker looks before it registers again. Measured: Director calls per new runtime, one-time
tokens Director made per runtime, registrations and duplicates in Director's own database,
and what the agents were answered.

Pure: no I/O but `merge_docs`; `bench.real` runs it (`--scenarios cut`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bench.report import FINDINGS_RECORD, merge_marked_section

SECTION_BEGIN = "<!-- bench.sessions_cut: begin (python -m bench.real --scenarios cut) -->"
SECTION_END = "<!-- bench.sessions_cut: end -->"
JSON_KEY = "sessions_cut"
DEFAULT_N = 200
EVERY_SECONDS = 0.5
FOR_SECONDS = 20.0
TOKEN = "requestOneTimeTokenForRuntime"


@dataclass
class CutRun:
    commit: str
    started: str
    n: int
    every: float
    for_seconds: float
    connected: int
    seconds: float | None
    rounds: int  # rounds of pg_terminate_backend
    sessions_ended: int
    registrations: int
    duplicates: int
    director_calls: dict[str, int]
    attempts: dict[str, int] = field(default_factory=dict)  # answers the agents got, by kind
    note: str = ""

    @property
    def calls_per_runtime(self) -> float | None:
        return sum(self.director_calls.values()) / self.n if self.n else None

    @property
    def tokens_per_runtime(self) -> float | None:
        return self.director_calls.get(TOKEN, 0) / self.n if self.n else None

    @property
    def refused(self) -> int:
        return sum(v for k, v in self.attempts.items() if "compass-rejected" in k)

    @property
    def met(self) -> bool:
        return self.connected == self.n and self.duplicates == 0 and self.refused == 0


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render(runs: Sequence[CutRun]) -> str:
    lines = [
        "## 13. Director's database sessions cut during a cold start (issue 40)",
        "",
        "N runtimes start cold against the real Director; from a quarter registered on, all its "
        "database sessions are ended (`pg_terminate_backend`) every 0.5 s for 20 s. The broker "
        "looks a runtime up after an answer that may have been committed "
        "([broker.md](broker.md#what-an-error-answer-proves-was-not-written)). Without the "
        f"fault a runtime costs 2 calls and 1 token ([0016](design/{FINDINGS_RECORD})). "
        "Reproduce: `python -m bench.real --scenarios cut --docs`.",
        "",
        "| commit | started | N | connected | time to all | rounds / sessions ended "
        "| registrations | duplicates | calls / runtime | tokens / runtime "
        "| refused | calls | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        calls = ", ".join(f"{k} {v}" for k, v in sorted(r.director_calls.items())) or "—"
        lines.append(
            f"| {r.commit} | {r.started} | {r.n} | {r.connected} | {_f(r.seconds, 1)} s "
            f"| {r.rounds} / {r.sessions_ended} | {r.registrations} | {r.duplicates} "
            f"| {_f(r.calls_per_runtime)} | {_f(r.tokens_per_runtime)} | {r.refused} "
            f"| {calls} | {'yes' if r.met else 'no'} |"
        )
    notes = [r.note for r in runs if r.note]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines)


def merge_section(text: str, section: str) -> str:
    """`text` with this section replaced (`bench.report.merge_marked_section`)."""
    return merge_marked_section(text, section, begin=SECTION_BEGIN, end=SECTION_END)


def from_json(data: Any) -> list[CutRun]:
    """The runs a report's JSON kept under `JSON_KEY` (unreadable entries skipped)."""
    names = {f.name for f in fields(CutRun)}
    runs = []
    for item in data.get("runs", []) if isinstance(data, Mapping) else []:
        try:
            runs.append(CutRun(**{k: v for k, v in item.items() if k in names}))
        except TypeError:
            continue
    return runs


def to_json(runs: Sequence[CutRun]) -> dict[str, Any]:
    return {
        "runs": [
            {
                **asdict(r),
                "calls_per_runtime": _round(r.calls_per_runtime),
                "tokens_per_runtime": _round(r.tokens_per_runtime),
                "refused": r.refused,
                "met": r.met,
            }
            for r in runs
        ]
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def merge_docs(out_dir: Path, new: Sequence[CutRun], *, report: str, data_file: str) -> None:
    """Adds `new` to the section and the JSON key of the report files in `out_dir` (the last
    five runs are kept), leaving everything else in both files as it was."""
    md_path, json_path = out_dir / report, out_dir / data_file
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    try:
        data = json.loads(json_path.read_text()) if json_path.exists() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    # The same run saved twice (a report saved again at the end) is one row.
    seen = {(r.commit, r.started, r.n) for r in new}
    kept = [r for r in from_json(data.get(JSON_KEY)) if (r.commit, r.started, r.n) not in seen]
    runs = [*kept, *new][-5:]
    data[JSON_KEY] = to_json(runs)
    md_path.write_text(merge_section(text, render(runs)))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
