"""Waiting for what another process or thread does: poll until a deadline, then fail saying
what was awaited (a sleep of a fixed length is either too short on a busy machine or slow)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object],
    what: str = "the condition held",
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
) -> None:
    """Return once `condition()` is true; AssertionError("timed out waiting until …") after
    `timeout` seconds. The condition is always checked once more at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(interval)


async def eventually(
    condition: Callable[[], object],
    what: str = "the condition held",
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
) -> None:
    """`wait_for` for a test on the event loop: it sleeps with asyncio, so servers on the
    same loop (hcsd's API) keep answering while it waits."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        await asyncio.sleep(interval)
