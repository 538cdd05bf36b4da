"""HCS_RESUME_FROM: the newest complete checkpoint of a pod that names its checkpoint directory.

A pod declares `hcs.io/checkpoint-path: /ckpt`, a path inside one of its volumes. When its
container is created, the NRI request carries the container's mounts with their host sources;
container_mounts.py finds the host directory the container sees there, and checkpoints.py the
newest complete checkpoint in it. The container gets `HCS_RESUME_STATUS` (`found`, `none`:
the scan ended and found nothing, `unknown`: hcsd could not tell) and, when found,
`HCS_RESUME_FROM=<that checkpoint's path in the container>`.

Decisions (docs/runtime.md, Checkpoint resume):

- Only containers that ask hcsd for devices are looked at (the plugin asks before the
  allocation, so that the scan runs outside it; the injector adds the edits only to a container
  it gives devices). Finding the checkpoint is work done as root on the host in a directory a
  tenant fills: a pod hcsd does not serve does not get to make hcsd do it.
- Nothing here ever fails a container's creation: a malformed annotation, a path on no host
  directory, an unreadable or oversized directory, a scan slower than `timeout` give
  `unknown` and a warning that names the container. hcsd holds no cluster credentials, so
  there is no Event; the log line is the record.
- Each scan runs in a daemon thread of its own, awaited up to `timeout` without blocking the
  event loop. A thread, not a child process: the per-name and per-directory bounds make a
  scan's CPU time milliseconds, and what a child could add, being killable, does not help
  against the one thing left (a hung network file system: a process in uninterruptible sleep
  is not killable either). A daemon thread, not an executor's: concurrent.futures joins its
  workers at exit, so a hung scan would hold up hcsd's stop. A scan past its timeout keeps
  its thread; while it hangs no other scan of the same mount source starts, and past
  MAX_RUNNING scans at once (hung or not) none starts at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import posixpath
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from hcsd.contract.names import ANNOTATION_CHECKPOINT_PATH, checkpoint_path_problem
from hcsd.runtime.checkpoints import CheckpointError, CheckpointSection, newest_complete
from hcsd.runtime.container_mounts import ContainerMount, MountError, locate, open_source
from hcsd.runtime.dirfd import open_dir
from hcsd.runtime.edits import ContainerEdits

__all__ = ["ENV", "MAX_RUNNING", "STATUS_ENV", "Resume", "Resumes", "Status", "newest_in"]

log = logging.getLogger(__name__)

ENV = "HCS_RESUME_FROM"
STATUS_ENV = "HCS_RESUME_STATUS"
MAX_RUNNING = 8  # scans at once, hung ones included: each holds a thread
Found = tuple[str | None, list[str]]
# (mount source, path below it, shadowed names, settings) -> the newest complete checkpoint
Scan = Callable[[str, str, Collection[str], CheckpointSection], Found]


class Status(enum.Enum):
    FOUND = "found"
    NONE = "none"  # the scan ended: nothing complete there
    UNKNOWN = "unknown"  # hcsd could not tell (logged why)


@dataclass(frozen=True, slots=True)
class Resume:
    """What a container is told: the status, and the checkpoint's path when found."""

    status: Status
    path: str = ""

    @property
    def edits(self) -> ContainerEdits:
        env = [(ENV, self.path)] if self.status is Status.FOUND else []
        return ContainerEdits(env=(*env, (STATUS_ENV, self.status.value)))


UNKNOWN = Resume(Status.UNKNOWN)


class Resumes:
    """The resume status of containers, each scan in a thread of its own (module docstring)."""

    def __init__(self, settings: CheckpointSection, *, scan: Scan | None = None) -> None:
        self.settings = settings
        self._scan = scan or newest_in
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}  # mount source -> scans of it not ended
        self._hung: set[str] = set()  # sources with a scan past its timeout, not ended
        self._threads: set[threading.Thread] = set()

    @property
    def hung(self) -> int:
        """Mount sources whose scan is past its timeout and has not ended."""
        with self._lock:
            return len(self._hung)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every scan to end (shutdown, tests); all ended?"""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in threads)

    async def look(
        self,
        label: str,
        container_annotations: Mapping[str, str],
        pod_annotations: Mapping[str, str],
        mounts: Iterable[ContainerMount],
        *,
        timeout: float | None = None,
    ) -> Resume | None:
        """The container's resume status; None when it does not ask (no annotation, or the
        feature is off). `timeout` (at most the setting's) shortens the wait."""
        text = container_annotations.get(
            ANNOTATION_CHECKPOINT_PATH, pod_annotations.get(ANNOTATION_CHECKPOINT_PATH)
        )
        if text is None or not self.settings.enabled:
            return None
        problem = checkpoint_path_problem(text)
        if problem is not None:
            log.warning("%s: no checkpoint resume: %s", label, problem)
            return UNKNOWN
        try:
            where = locate(text, mounts)
        except MountError as e:
            log.warning("%s: no checkpoint resume: %s %s", label, ANNOTATION_CHECKPOINT_PATH, e)
            return UNKNOWN
        source = where.mount.source
        limit = min(timeout or self.settings.timeout, self.settings.timeout)
        result = await self._run(
            label, source, lambda: self._scan(source, where.below, where.shadowed, self.settings)
        ).wait(limit)
        if isinstance(result, str):
            log.warning("%s: no checkpoint resume: %s", label, result)
            return UNKNOWN
        name, problems = result
        for problem in problems:
            log.warning("%s: checkpoints in %s: %s", label, text, problem)
        if name is None:
            log.info("%s: no complete checkpoint in %s: %s=none", label, text, STATUS_ENV)
            return Resume(Status.NONE)
        inside = posixpath.join(text, name)
        log.info("%s: resuming from the newest complete checkpoint: %s=%s", label, ENV, inside)
        return Resume(Status.FOUND, inside)

    def _run(self, label: str, source: str, work: Callable[[], Found]) -> _Waiting:
        """`work` started in a thread (gated: module docstring), or why not."""
        with self._lock:
            if source in self._hung:
                return _Waiting(
                    "an earlier scan of the same mount source has not ended (a hung file "
                    "system?); none of it starts until it does"
                )
            if sum(self._running.values()) >= MAX_RUNNING:
                return _Waiting(
                    f"{MAX_RUNNING} checkpoint scans are still running (hung file systems?); "
                    "none starts until one ends"
                )
            self._running[source] = self._running.get(source, 0) + 1
        waiting = _Waiting(None, asyncio.get_running_loop(), self, source)

        def run() -> None:
            try:
                outcome: Found | str = work()
            except OSError as e:
                where = f" at {e.filename!r}" if isinstance(e.filename, str) else ""
                outcome = f"failed to read its directory: {e.strerror or e}{where}"
            except (CheckpointError, MountError) as e:  # their messages say "failed to …"
                outcome = str(e)
            except Exception as e:  # whatever it is, the creation goes on
                log.error("%s: the checkpoint scan failed", label, exc_info=e)
                outcome = f"the scan failed: {e}"
            finally:
                self._ended(source, threading.current_thread())
            waiting.deliver(outcome)

        thread = threading.Thread(target=run, name="hcsd-checkpoint-scan", daemon=True)
        try:
            with self._lock:
                self._threads.add(thread)
            thread.start()
        except RuntimeError as e:  # no thread to be had: the creation goes on without
            self._ended(source, thread)
            return _Waiting(f"failed to start the scan: {e}")
        return waiting

    def _ended(self, source: str, thread: threading.Thread) -> None:
        with self._lock:
            self._running[source] -= 1
            if not self._running[source]:
                del self._running[source]
                self._hung.discard(source)
            self._threads.discard(thread)

    def _timed_out(self, source: str) -> None:
        with self._lock:
            if source in self._running:
                self._hung.add(source)


class _Waiting:
    """One scan's outcome, delivered from its thread into the event loop."""

    def __init__(
        self,
        refused: str | None,
        loop: asyncio.AbstractEventLoop | None = None,
        owner: Resumes | None = None,
        source: str = "",
    ) -> None:
        self.refused = refused
        self.loop = loop
        self.owner = owner
        self.source = source
        self.future: asyncio.Future[Found | str] | None = loop.create_future() if loop else None

    def deliver(self, outcome: Found | str) -> None:
        assert self.loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._set, outcome)

    def _set(self, outcome: Found | str) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(outcome)

    async def wait(self, timeout: float) -> Found | str:
        if self.refused is not None or self.future is None:
            return self.refused or "no scan"
        try:
            return await asyncio.wait_for(asyncio.shield(self.future), timeout)
        except TimeoutError:
            assert self.owner is not None
            self.owner._timed_out(self.source)
            return (
                f"the scan took longer than {timeout:.2g} s (runtime.checkpoints.timeout); "
                "it goes on in the background"
            )


def newest_in(
    source: str, below: str, shadowed: Collection[str], settings: CheckpointSection
) -> Found:
    """Open the mount's source and `below` without following a link, and find the newest
    complete checkpoint there. A directory below the source not made yet holds none; a
    missing source is an error (hcsd cannot see what the container sees: its unit's
    PrivateTmp hides /tmp and /var/tmp, ProtectHome /home)."""
    try:
        fd = open_source(source)
    except FileNotFoundError as e:
        raise MountError(
            f"failed to open the mount source {source!r}: it does not exist in hcsd's view "
            "(under /tmp, /var/tmp or /home, hidden by its unit's PrivateTmp or ProtectHome?)"
        ) from e
    try:
        for part in below.split("/") if below else ():
            try:
                child = open_dir(part, fd)
            except FileNotFoundError:
                return None, []
            os.close(fd)
            fd = child
        return newest_complete(fd, settings, shadowed)
    finally:
        os.close(fd)
