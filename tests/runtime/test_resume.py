"""The resume status a container is told, and how scans are run: in threads awaited without
blocking the event loop, each bounded by `timeout`, and gated per mount source so that one
tenant's hung (or slow) directory costs other pods nothing."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from hcsd.runtime.checkpoints import CheckpointSection
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.resume import ENV, MAX_RUNNING, STATUS_ENV, Found, Resume, Resumes, Status

LABEL = "team-a/trainer/main"
ANNOTATED = {"hcs.io/checkpoint-path": "/ckpt"}


class StandIn:
    """A scan that answers what the test says, after the test lets it (a hung file system
    until then), recording the sources it was asked about."""

    def __init__(self, answer: Callable[[str], Found] = lambda source: ("step-1", [])) -> None:
        self.answer = answer
        self.sources: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def hang(self) -> None:
        self.release.clear()

    def __call__(
        self, source: str, below: str, shadowed: Collection[str], settings: CheckpointSection
    ) -> Found:
        self.sources.append(source)
        self.started.set()
        self.release.wait(30)
        return self.answer(source)


async def look(resumes: Resumes, source: str = "/volumes/a") -> Resume | None:
    return await resumes.look(LABEL, {}, ANNOTATED, [ContainerMount("/ckpt", source)])


@pytest.mark.parametrize(
    ("resume", "env"),
    [
        pytest.param(
            Resume(Status.FOUND, "/ckpt/step-2"),
            {ENV: "/ckpt/step-2", STATUS_ENV: "found"},
            id="found",
        ),
        pytest.param(Resume(Status.NONE), {STATUS_ENV: "none"}, id="none"),
        pytest.param(Resume(Status.UNKNOWN), {STATUS_ENV: "unknown"}, id="unknown"),
    ],
)
def test_the_status_is_always_told(resume: Resume, env: dict[str, str]) -> None:
    assert dict(resume.edits.env) == env


async def test_a_hung_scan_costs_its_creation_the_timeout_and_other_pods_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hung file system under one pod's volume: that creation waits `timeout` and is told
    `unknown`; the next scan of the same source does not start (it would hang a thread too),
    while another pod's volume is scanned as usual."""
    scans = StandIn()
    resumes = Resumes(CheckpointSection(timeout=0.05), scan=scans)
    scans.hang()
    with caplog.at_level(logging.WARNING):
        assert await look(resumes) == Resume(Status.UNKNOWN)
        assert resumes.hung == 1
        assert await look(resumes) == Resume(Status.UNKNOWN)
    assert scans.sources == ["/volumes/a"]  # the second did not start
    assert f"{LABEL}: no checkpoint resume: the scan took longer than 0.05 s" in caplog.text
    assert "an earlier scan of the same mount source has not ended" in caplog.text
    scans.started.clear()
    other = asyncio.create_task(look(resumes, "/volumes/b"))
    await asyncio.to_thread(scans.started.wait, 5)
    scans.release.set()  # b's scan is hung like a's until now: both end
    assert await other == Resume(Status.FOUND, "/ckpt/step-1")
    assert resumes.join(5) and resumes.hung == 0
    assert await look(resumes) == Resume(Status.FOUND, "/ckpt/step-1")  # a's may start again


async def test_few_hung_scans_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Each hung scan holds a thread: past MAX_RUNNING of them none starts."""
    scans = StandIn()
    scans.hang()
    resumes = Resumes(CheckpointSection(timeout=0.01), scan=scans)
    for number in range(MAX_RUNNING):
        assert await look(resumes, f"/volumes/{number}") == Resume(Status.UNKNOWN)
    with caplog.at_level(logging.WARNING):
        assert await look(resumes, "/volumes/next") == Resume(Status.UNKNOWN)
    assert "/volumes/next" not in scans.sources
    assert f"{MAX_RUNNING} checkpoint scans are still running" in caplog.text
    scans.release.set()
    assert resumes.join(5)
    assert await look(resumes, "/volumes/next") == Resume(Status.FOUND, "/ckpt/step-1")


async def test_the_event_loop_runs_while_a_scan_does() -> None:
    """The scan waits for something only the event loop does (here: the test setting the
    event after the scan started); a scan that blocked the loop would time out instead."""
    scans = StandIn()
    scans.hang()
    resumes = Resumes(CheckpointSection(timeout=1.0), scan=scans)
    task = asyncio.create_task(look(resumes))
    await asyncio.to_thread(scans.started.wait, 5)
    scans.release.set()
    assert await task == Resume(Status.FOUND, "/ckpt/step-1")


async def test_a_shorter_wait_than_the_setting_is_kept() -> None:
    scans = StandIn()
    scans.hang()
    resumes = Resumes(CheckpointSection(timeout=1.0), scan=scans)
    mounts = [ContainerMount("/ckpt", "/volumes/a")]
    waited = asyncio.get_running_loop().time()
    assert await resumes.look(LABEL, {}, ANNOTATED, mounts, timeout=0.05) == Resume(Status.UNKNOWN)
    assert asyncio.get_running_loop().time() - waited < 0.9
    scans.release.set()
    assert resumes.join(5)


async def test_a_scan_that_fails_unexpectedly_never_fails_the_creation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(source: str) -> Found:
        raise ValueError("a bug in the scan")

    resumes = Resumes(CheckpointSection(), scan=StandIn(broken))
    with caplog.at_level(logging.WARNING):
        assert await look(resumes) == Resume(Status.UNKNOWN)
    assert f"{LABEL}: the checkpoint scan failed" in caplog.text
    assert "a bug in the scan" in caplog.text
    assert resumes.join(5) and resumes.hung == 0


async def test_a_container_that_does_not_ask_is_not_looked_at(tmp_path: Path) -> None:
    scans = StandIn()
    resumes = Resumes(CheckpointSection(), scan=scans)
    mounts = [ContainerMount("/ckpt", str(tmp_path))]
    assert await resumes.look(LABEL, {}, {}, mounts) is None
    off = Resumes(CheckpointSection(enabled=False), scan=scans)
    assert await off.look(LABEL, {}, ANNOTATED, mounts) is None
    assert scans.sources == []
