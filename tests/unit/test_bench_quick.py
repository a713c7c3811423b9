"""`python -m bench --quick` end to end: real API servers, simulator, broker and agent processes.

Not a unit test in spirit (it starts processes and takes minutes), so it runs only when asked:
`BENCH_QUICK=1 pytest tests/unit/test_bench_quick.py`. It checks that the harness still works
against the current broker and agent, not their figures.
"""

from __future__ import annotations

import os
import re
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
def test_quick_run_writes_every_table_and_the_plot(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[bench" in result.stderr  # progress was shown
    text = (tmp_path / "benchmarks.md").read_text()
    for section in ("## 1. Cold start", "## 2. Outage", "## 3. Steady state", "## 4. Agent"):
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        assert "Not run." not in body, section
        assert "|---|" in body, section
    assert "**not measured**" not in text
    # Duplicate registrations are a column of both fleet tables: all zero.
    for row in re.findall(r"^\| 20 \|.*$", text, flags=re.MULTILINE):
        assert "DUPLICATE" not in row
    assert "DUPLICATE" not in text
    png = (tmp_path / "benchmarks-outage.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
