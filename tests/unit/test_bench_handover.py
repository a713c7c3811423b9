"""bench.handover's pure pieces: the figures' summary and the docs section it owns."""

from __future__ import annotations

from bench.handover import (
    SECTION,
    HandoverResult,
    Reconnect,
    render_section,
    replace_section,
    reproduce,
    result_from_json,
    spread,
)


def result() -> HandoverResult:
    return HandoverResult(
        commit="abc",
        started="2026-12-06 05:34 UTC",
        sync_period=180,
        minimal_sync=15,
        first_connection_tokens=1,
        first_connected=14,
        first_synchronized=380,
        reconnects=[Reconnect(i, 1, 16.0, 100.0 + i, 101.0 + i) for i in range(1, 4)],
        wall_seconds=1800,
        complete=True,
    )


def test_tokens_per_reconnect_and_spread() -> None:
    assert result().tokens_per_reconnect == 1.0
    assert HandoverResult("c", "s", 180, 15).tokens_per_reconnect is None
    assert spread([1.0, None, 3.0, 2.0]) == "median 2 s (min 1 - max 3 s, n = 3)"
    assert spread([None]) == "-"


def test_the_section_names_the_figures_and_the_command() -> None:
    text = render_section(result(), "python -m bench.handover --reconnects 3")
    assert text.startswith(SECTION + "\n")
    assert "**1.00** (3 for 3)" in text
    assert "`python -m bench.handover --reconnects 3`" in text
    assert "Commit `abc`" in text


def test_only_its_own_section_is_replaced() -> None:
    before = "# B\n\n## Other\nkept\n\n" + SECTION + "\nold\n\n## After\nalso kept\n"
    after = replace_section(before, SECTION + "\nnew\n")
    assert after == "# B\n\n## Other\nkept\n\n" + SECTION + "\nnew\n\n## After\nalso kept\n"
    # At the end of the document, and absent (appended).
    assert replace_section("# B\n\n" + SECTION + "\nold\n", SECTION + "\nnew\n").endswith("\nnew\n")
    assert replace_section("# B\n", SECTION + "\nnew\n") == "# B\n\n" + SECTION + "\nnew\n"


def test_a_saved_run_reads_back() -> None:
    saved = result()
    data = {**saved.__dict__, "reconnects": [r.__dict__ for r in saved.reconnects], "x": 1}
    assert result_from_json(data) == saved


def test_the_command_to_reproduce_names_the_settings() -> None:
    run = result()
    assert reproduce(run) == (
        "python -m bench.handover --reconnects 3 --sync-period 180 --minimal-sync 15 --docs"
    )
    run.random_phase = True
    assert reproduce(run).endswith("--random-phase --docs")
    text = " ".join(render_section(run, reproduce(run)).split())  # wrapped at 100 columns
    assert "anywhere in the real agent's resync cycle" in text
    assert all(
        len(line) <= 100 for line in render_section(run, "x").splitlines() if line[:1] != "|"
    )


def test_the_next_generators_marker_ends_the_section() -> None:
    marker = "<!-- bench.sessions_cut: begin -->\n## 13. Cut\n"
    before = "# B\n\n" + SECTION + "\nold\n\n" + marker
    assert (
        replace_section(before, SECTION + "\nnew\n") == "# B\n\n" + SECTION + "\nnew\n\n" + marker
    )
