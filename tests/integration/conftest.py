"""Fixtures the simulator's HTTP tests share; each test module gets its own instances."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from devenv.compass_sim.testing import ManualClock


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    """A clock the test moves by hand, for the simulator under test."""
    return ManualClock()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client
