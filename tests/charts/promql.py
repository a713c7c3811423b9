"""Prometheus's own rule and PromQL parser (`promql-check`, from the pinned prometheus module),
and the metric names of a real scrape of the broker: what alert rules and dashboard queries are
held against."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO_ROOT
from tests.integration.broker.conftest import BrokerFactory

BUILD = REPO_ROOT / "devenv" / "toolchain" / "build.sh"
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}


@cache
def promql_check() -> Path:
    """Built once into the toolchain's cache (about a minute the first time)."""
    result = subprocess.run(
        ["bash", str(BUILD), "promql-check"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"promql-check could not be built:\n{result.stderr}")
    return Path(result.stdout.strip())


def check_rules(path: Path) -> list[dict[str, Any]]:
    """`promtool check rules`: parsed by rulefmt; each rule with the metrics it selects."""
    result = subprocess.run(
        [str(promql_check()), "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"the rules do not parse:\n{result.stderr}"
    exprs: list[dict[str, Any]] = json.loads(result.stdout)["exprs"]
    return exprs


def check_exprs(exprs: Sequence[str]) -> list[dict[str, Any]]:
    """Each PromQL expression parsed as Prometheus parses it, with the metrics it selects."""
    result = subprocess.run(
        [str(promql_check()), "exprs"],
        input=json.dumps(list(exprs)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"queries do not parse:\n{result.stderr}"
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def scraped_names(text: str) -> set[str]:
    """Every series name the exposition declares: a family with no sample yet counts (a counter
    with labels has none until its first increment, yet it is exported)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ())}
        names |= {sample.name for sample in family.samples}
    return names


@pytest.fixture
def broker_exposition(control_plane: Any, kcp_ns: str, sim: Any, creds_file: Path) -> Iterator[str]:
    """A real broker's `/metrics` (against a real API server), scraped once it is ready."""
    factory = BrokerFactory(control_plane, kcp_ns, sim, creds_file)
    broker = factory()
    try:
        yield httpx.get(f"{broker.url}/metrics", timeout=10).text
    finally:
        broker.stop()
        broker.kill()


@pytest.fixture
def broker_scrape(broker_exposition: str) -> set[str]:
    """The metric names of a real broker's `/metrics`."""
    return scraped_names(broker_exposition)
