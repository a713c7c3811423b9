"""The outage plot: connected runtimes over time, one panel per fleet size.

Each panel shades the outage, marks Director's return, and draws the capacity line: the most
runtimes Director could have connected since its return (C / (2 L) per second).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from bench import stats
from bench.results import OutageResult


def capacity_line(result: OutageResult, end: float) -> tuple[list[float], list[float]]:
    """(x, y) of the ideal: nothing while down, then C / (2 L) runtimes per second, up to N."""
    if result.latency <= 0:
        return [result.up_at, result.up_at], [0.0, float(result.n)]
    rate = result.capacity / (stats.CALLS_PER_NEW_RUNTIME * result.latency)
    full = result.up_at + result.n / rate
    return [0.0, result.up_at, min(full, end), end], [
        0.0,
        0.0,
        min(result.n, rate * (min(full, end) - result.up_at)),
        min(result.n, rate * (min(full, end) - result.up_at)),
    ]


def title(result: OutageResult) -> str:
    head = f"N = {result.n:,}, Director down for {result.up_at - result.down_at:.0f} s: "
    bound = f"bound {result.bound:.1f} s"
    if result.recovery_seconds is None:
        return head + f"{result.connected:,} of {result.n:,} connected by the deadline ({bound})"
    ratio = stats.ratio(result.recovery_seconds, result.bound)
    shown = f", {ratio:.1f}x" if ratio is not None else ""
    return head + f"all connected {result.recovery_seconds:.0f} s after its return ({bound}{shown})"


def plot_outage(results: Sequence[OutageResult], path: Path) -> Path:
    panels = len(results)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels), squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        xs, ys = stats.cumulative(r.connect_times, since=0.0)
        end = max([*xs, r.up_at + r.bound, r.ended_at]) * 1.02 + 1
        ax.axvspan(r.down_at, r.up_at, color="tab:red", alpha=0.12, label="Director down")
        ax.step([0.0, *xs], [0, *ys], where="post", color="tab:blue", label="connected")
        cx, cy = capacity_line(r, end)
        ax.plot(cx, cy, linestyle="--", color="tab:gray", label="capacity bound (2 calls)")
        ax.axhline(r.n, color="black", linewidth=0.5)
        ax.set_xlim(0, end)
        ax.set_ylim(0, r.n * 1.08)
        ax.set_title(title(r), fontsize=10)
        ax.set_ylabel("runtimes connected")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the fleet started asking")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
