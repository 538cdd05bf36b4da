"""What other tasks see of the process umask: a socket bound under a narrow umask must not
leave it set across an await, or files other tasks create meanwhile get the wrong mode."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def umasks_seen() -> AsyncIterator[set[int]]:
    """Set the usual 022, then record every umask another task observes while the body runs;
    the umask from before is restored after."""
    usual = os.umask(0o022)
    seen: set[int] = set()

    async def observe() -> None:
        while True:
            current = os.umask(0o022)
            os.umask(current)
            seen.add(current)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(observe())
    try:
        yield seen
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        os.umask(usual)
