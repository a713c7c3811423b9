"""What the demo looks at, apart from Kubernetes objects: the simulator's admin API, the
Prometheus metrics of the broker and the agents, and the agents' JSON log lines.

Holds: read-only except `SimAdmin.set_down` / `clear_faults` (the demo's fault switch); nothing
here handles a token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devenv.demo.processes import json_lines


@dataclass
class DirectorCalls:
    made: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.made.values())

    def describe(self) -> str:
        """E.g. "registerRuntime: 1, runtimes: 5 (3 failed)"."""
        parts = []
        for name, count in sorted(self.made.items()):
            failed = self.failed[name]
            parts.append(f"{name}: {count}" + (f" ({failed} failed)" if failed else ""))
        return ", ".join(parts) or "none"


class SimAdmin:
    """The Compass simulator's `/_sim/` API, on its admin listener (up even while "down")."""

    calls_source = "as the simulator recorded them"

    def __init__(self, admin_url: str) -> None:
        self._http = httpx.Client(base_url=admin_url.rstrip("/") + "/_sim", timeout=5.0)

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str, **params: str) -> Any:
        response = self._http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def healthy(self) -> bool:
        try:
            return bool(self._get("/health").get("ok"))
        except httpx.HTTPError:
            return False

    def set_down(self, mode: str) -> None:
        self._http.patch("/faults", json={"down": mode}).raise_for_status()

    def clear_faults(self) -> None:
        self._http.delete("/faults").raise_for_status()

    def listening(self) -> bool:
        return bool(self._get("/health").get("listening"))

    def runtimes(self, tenant: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get("/runtimes", tenant=tenant)
        return found

    def director_calls(self, tenant: str) -> DirectorCalls:
        """Director operations the simulator saw for `tenant` (whatever their outcome)."""
        calls = DirectorCalls()
        for record in self._get("/requests", tenant=tenant):
            if record.get("endpoint") != "director":
                continue
            calls.made[record["operation"]] += 1
            if record.get("outcome") != "ok" or record.get("error_codes"):
                calls.failed[record["operation"]] += 1
        return calls

    def connector_exchanges(self, runtime_id: str) -> int:
        """Connector tokens of this Compass runtime that were used (one-time and CSR tokens)."""
        tokens = self._get("/tokens", runtime_id=runtime_id)
        return sum(1 for t in tokens if t.get("used_at"))


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text at `url` as {(sample name, sorted labels): value}; empty when down."""
    try:
        text = httpx.get(url, timeout=5.0).text
    except httpx.HTTPError:
        return {}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def samples_by_label(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str
) -> dict[str, float]:
    """{label value: sample value} of one metric, e.g. token requests by outcome."""
    out: dict[str, float] = {}
    for (sample_name, labels), value in samples.items():
        if sample_name == name:
            out[dict(labels).get(label, "")] = value
    return out


@dataclass(frozen=True)
class Backoff:
    """One temporary answer the agent got and how long the broker asked it to wait."""

    status: int | None
    reason: str
    retry_after: float | None


def agent_backoffs(log_path: Path) -> list[Backoff]:
    """The agent's "broker not ready, will retry" log lines, oldest first."""
    return [
        Backoff(
            status=entry.get("status"),
            reason=str(entry.get("reason") or "").rsplit(":", 1)[-1],
            retry_after=entry.get("retry_after"),
        )
        for entry in json_lines(log_path)
        if entry.get("msg") == "broker not ready, will retry"
    ]


def seconds_list(values: Iterable[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:g}s" for v in values)
