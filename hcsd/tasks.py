"""Supervised asyncio tasks: every background task is named, and its end is logged.

A bare `create_task` whose exception nobody awaits fails silently until garbage collection;
here every task has a name, "failed / finished unexpectedly / cancelled" is always logged, and
`run_tasks` stops the rest when a root task ends, so the daemon never runs half-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

__all__ = ["run_tasks", "supervise"]

log = logging.getLogger(__name__)


def supervise(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """Start a named task whose ending, however it ends, is logged."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_end)
    return task


def _log_end(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        log.debug("task %s cancelled", task.get_name())
        return
    error = task.exception()
    if error is not None:
        log.error("task %s failed: %s", task.get_name(), error, exc_info=error)
    else:
        log.debug("task %s finished", task.get_name())


async def run_tasks(roots: Iterable[asyncio.Task[Any]], *, grace: float = 5.0) -> None:
    """Wait until any root task ends, then stop the others and re-raise a failure.

    The others get `grace` seconds after cancellation to clean up; whatever is still running
    then is abandoned with a log line rather than hanging shutdown.
    """
    pending = set(roots)
    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if not task.cancelled() and task.exception() is None:
            log.debug("task %s finished; stopping the others", task.get_name())
    for task in pending:
        task.cancel()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=grace)
        for task in stuck:
            log.error("task %s did not stop within %.1fs", task.get_name(), grace)
    for task in done:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error
    with contextlib.suppress(asyncio.CancelledError):
        for task in done:
            task.result()
