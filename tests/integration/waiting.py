"""Waiting on a condition instead of sleeping: what every integration test polls with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest


async def eventually(
    check: Callable[[], Any], *, within: float = 15.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Polls `check` (sync) until it returns something truthy; fails the test after `within` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(interval)


def wait_until(
    predicate: Callable[[], Any], *, within: float, what: str, interval: float = 0.25
) -> Any:
    """Polls `predicate` until it returns something truthy; for tests that are not async."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(interval)
