"""Supervised tasks: every ending is logged by name, and one root ending stops the others."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hcsd.tasks import run_tasks, supervise


async def forever() -> None:
    await asyncio.Event().wait()


async def fails() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("disk on fire")


async def returns() -> None:
    await asyncio.sleep(0)


async def test_a_failing_task_is_logged_with_its_name_and_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, "hcsd.tasks"):
        task = supervise(fails(), "ledger-compactor")
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)  # done callbacks run on the next loop pass
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "task ledger-compactor failed: disk on fire"
    assert record.exc_info is not None and record.exc_info[1] is task.exception()


@pytest.mark.parametrize(
    ("cancel", "message"),
    [
        pytest.param(False, "task quick finished", id="finished"),
        pytest.param(True, "task quick cancelled", id="cancelled"),
    ],
)
async def test_every_other_ending_is_logged_too(
    caplog: pytest.LogCaptureFixture, cancel: bool, message: str
) -> None:
    with caplog.at_level(logging.DEBUG, "hcsd.tasks"):
        task = supervise(forever() if cancel else returns(), "quick")
        if cancel:
            await asyncio.sleep(0)
            task.cancel()
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert task.get_name() == "quick"
    assert [r.getMessage() for r in caplog.records] == [message]


async def test_a_root_that_returns_stops_the_others() -> None:
    done = supervise(returns(), "done")
    other = supervise(forever(), "other")
    await asyncio.wait_for(run_tasks([done, other]), 2)
    assert other.cancelled()


async def test_a_root_that_fails_stops_the_others_and_its_error_is_raised() -> None:
    failed = supervise(fails(), "failed")
    other = supervise(forever(), "other")
    with pytest.raises(RuntimeError, match="disk on fire"):
        await asyncio.wait_for(run_tasks([failed, other]), 2)
    assert other.cancelled()


async def test_a_task_that_ignores_cancellation_is_abandoned_after_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # swallows every cancellation

    stuck = supervise(stubborn(), "stubborn")
    with caplog.at_level(logging.ERROR, "hcsd.tasks"):
        await asyncio.wait_for(run_tasks([supervise(returns(), "done"), stuck], grace=0.1), 2)
    assert "task stubborn did not stop within 0.1s" in caplog.text
    assert not stuck.done()
    release.set()
    stuck.cancel()
    await asyncio.wait([stuck])
