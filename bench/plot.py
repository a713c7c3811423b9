"""Plots of connected runtimes over time, one panel per run (cold start or outage).

Each panel draws the capacity line: the most runtimes Director could have connected since it
became available (C / (2 L) per second); an outage panel shades the outage and starts that
line at Director's return.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from bench import stats
from bench.results import FleetRunResult


def capacity_line(result: FleetRunResult, end: float) -> tuple[list[float], list[float]]:
    """(x, y) of the ideal: nothing before Director is available, then C / (2 L) runtimes per
    second, up to N."""
    start = result.up_at if result.scenario == "outage" else 0.0
    if result.latency <= 0:
        return [start, start], [0.0, float(result.n)]
    rate = result.capacity / (stats.CALLS_PER_NEW_RUNTIME * result.latency)
    full = min(start + result.n / rate, end)
    top = min(result.n, rate * (full - start))
    return [0.0, start, full, end], [0.0, 0.0, top, top]


def title(result: FleetRunResult) -> str:
    who = f"{result.replicas} brokers, " if result.replicas > 1 else ""
    if result.scenario == "outage":
        head = f"N = {result.n:,}, {who}Director down for {result.up_at:.0f} s: "
        done = "all connected {t:.0f} s after its return"
    else:
        head = f"N = {result.n:,}, {who}cold start ({result.identity_mode}): "
        done = "all connected after {t:.0f} s"
    bound = f"bound {result.bound:.1f} s"
    if result.time is None:
        return head + f"{result.connected:,} of {result.n:,} connected by the deadline ({bound})"
    ratio = result.ratio
    shown = f", {ratio:.2f}x" if ratio is not None else ""
    return head + done.format(t=result.time) + f" ({bound}{shown})"


def plot_connected(results: Sequence[FleetRunResult], path: Path) -> Path:
    panels = len(results)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels), squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        xs, ys = stats.cumulative(r.connect_times, since=0.0)
        start = r.up_at if r.scenario == "outage" else 0.0
        end = max([*xs, start + r.bound, r.ended_at]) * 1.02 + 1
        if r.scenario == "outage":
            ax.axvspan(0.0, r.up_at, color="tab:red", alpha=0.12, label="Director down")
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
