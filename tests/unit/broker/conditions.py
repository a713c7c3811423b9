"""Waiting on a condition in unit tests, instead of sleeping for a guessed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(check: Callable[[], bool], *, within: float = 5.0, what: str = "") -> None:
    """Yields to the loop until `check()` holds; fails after `within` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what or check}")
        await asyncio.sleep(0.001)
