"""`python -m bench --quick` end to end: real API servers, simulator, broker and agent processes.

Not a unit test in spirit (it starts processes and takes minutes), so it runs only when asked:
`BENCH_QUICK=1 pytest tests/unit/test_bench_quick.py`. It checks that the harness still works
against the current broker and agent, not their figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("BENCH_QUICK") != "1",
    reason="starts API servers, the simulator, the broker and the agent for minutes: "
    "set BENCH_QUICK=1 to run it",
)


@pytest.mark.timeout(900)
def test_quick_run_writes_every_table_the_json_and_the_plots(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--profile", "--out-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[bench" in result.stderr  # progress was shown
    text = (tmp_path / "benchmarks.md").read_text()
    for section in (
        "## 1. Cold start",
        "## 2. Outage",
        "## 3. Second configuration",
        "## 4. Identity modes",
        "## 5. Broker replicas",
        "## 6. Steady state",
        "## 7. Who used the cores",
        "## 9. Agent footprint",
    ):
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        assert "Not run." not in body, section
        assert "|---|" in body, section
    slow = text.split("## 12. A slow Director", 1)[1].split("<!-- bench.slow: end -->", 1)[0]
    assert "| simulator |" in slow
    profile = text.split("## 8. Profile", 1)[1].split("\n## ", 1)[0]
    assert "| frame (own time) | share |" in profile
    # Duplicate registrations are a column of every fleet table: all zero.
    assert "DUPLICATE" not in text
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    scenarios = {(r["scenario"], r.get("table")) for r in data["runs"]}
    assert scenarios >= {
        ("cold", "primary"),
        ("outage", "primary"),
        ("cold", "legacy"),
        ("outage", "legacy"),
        ("cold", "identity"),
        ("cold", "replicas"),
        ("steady", None),
        ("footprint", None),
    }
    fleet = [r for r in data["runs"] if r["scenario"] in ("cold", "outage")]
    assert all(r["connected"] == r["n"] == 20 and r["duplicates"] == 0 for r in fleet)
    assert all(r["kcp_requests_total"] > 0 for r in fleet)
    tokenreview = next(r for r in fleet if r["identity_mode"] == "tokenreview")
    assert tokenreview["runtime_api_requests"].get("POST tokenreviews", 0) > 0
    # Only the sizes of the issue that a quick run leaves out are not measured.
    unmeasured = [v["target"] for v in data["verdicts"] if v["status"] == "not measured"]
    assert all("1,000" in t or "5,000" in t for t in unmeasured), unmeasured
    for name in ("benchmarks-cold.png", "benchmarks-outage.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
