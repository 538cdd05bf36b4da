"""HCS_RESUME_FROM: the newest complete checkpoint of a pod that names its checkpoint directory.

A pod declares `hcs.io/checkpoint-path: /ckpt`, a path inside one of its volumes. When its
container is created, the NRI request carries the container's mounts with their host sources;
the mount whose destination holds the path (the deepest one, as in the container) leads to the
host directory, where hcsd/runtime/checkpoints.py finds the newest complete checkpoint. The
container gets `HCS_RESUME_FROM=<that checkpoint's path in the container>`, or nothing.

Decisions (docs/runtime.md, Checkpoint resume):

- Only containers hcsd gives devices get it (the injector asks after their allocation: a
  verified assignment in cluster mode, a local request in standalone mode). The variable is
  harmless information, but finding it is work done as root on the host in a directory a
  tenant fills: a pod hcsd does not serve does not get to make hcsd do it.
- Nothing here ever fails a container's creation. A malformed annotation, a path in no
  mount, an unreadable or oversized directory, a scan slower than `timeout`: the container
  starts without HCS_RESUME_FROM (the training script starts afresh, as on its first run) and
  hcsd logs a warning that names the container. hcsd holds no cluster credentials, so there is
  no Event; the log line is the record.
- The mount's host source is opened as the runtime opens it to bind-mount it (links in the
  path the kubelet or the operator chose are followed, the container sees the same
  directory); below it, in what the tenant controls, nothing is followed (checkpoints.py).
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hcsd.contract.names import ANNOTATION_CHECKPOINT_PATH, checkpoint_path_problem
from hcsd.runtime.checkpoints import CheckpointError, CheckpointSection, newest_complete
from hcsd.runtime.dirfd import open_dir
from hcsd.runtime.edits import ContainerEdits

__all__ = ["ENV", "BindMount", "Resumes", "locate"]

log = logging.getLogger(__name__)

ENV = "HCS_RESUME_FROM"
Found = tuple[str | None, list[str]]


@dataclass(frozen=True, slots=True)
class BindMount:
    """A host directory or file bind-mounted into the container, as the runtime has it."""

    destination: str  # in the container
    source: str  # on the host


def locate(path: str, mounts: Iterable[BindMount]) -> tuple[BindMount, str] | None:
    """The mount that holds `path` in the container (the deepest destination wins, as it
    hides the others there) and the path below its source ("" for the source itself)."""
    best: tuple[BindMount, str] | None = None
    for mount in mounts:
        destination = posixpath.normpath(mount.destination)
        if not destination.startswith("/") or not os.path.isabs(mount.source):
            continue
        if path == destination:
            below = ""
        elif path.startswith(destination.rstrip("/") + "/"):
            below = path[len(destination.rstrip("/")) + 1 :]
        else:
            continue
        if best is None or len(destination) >= len(posixpath.normpath(best[0].destination)):
            best = (mount, below)
    return best


class Resumes:
    """The resume edits of containers; scans run one at a time in a thread of their own, so
    that a hung file system costs a creation at most `timeout` and hcsd nothing after."""

    def __init__(self, settings: CheckpointSection) -> None:
        self.settings = settings
        self._running: threading.Thread | None = None  # a scan past its timeout, still going

    def edits(
        self,
        label: str,
        container_annotations: Mapping[str, str],
        pod_annotations: Mapping[str, str],
        mounts: Iterable[BindMount],
    ) -> ContainerEdits:
        """HCS_RESUME_FROM for the container, or no edits (logged why, when it asked)."""
        text = container_annotations.get(
            ANNOTATION_CHECKPOINT_PATH, pod_annotations.get(ANNOTATION_CHECKPOINT_PATH)
        )
        if text is None or not self.settings.enabled:
            return ContainerEdits()
        problem = checkpoint_path_problem(text)
        if problem is not None:
            log.warning("%s: no checkpoint resume: %s", label, problem)
            return ContainerEdits()
        found = locate(text, mounts)
        if found is None:
            log.warning(
                "%s: no checkpoint resume: %s %r is in none of the container's bind mounts",
                label,
                ANNOTATION_CHECKPOINT_PATH,
                text,
            )
            return ContainerEdits()
        mount, below = found
        result = self._scan(label, lambda: _newest(mount.source, below, self.settings))
        if result is None:
            return ContainerEdits()
        name, problems = result
        for problem in problems:
            log.warning("%s: checkpoints in %s: %s", label, text, problem)
        if name is None:
            log.info("%s: no complete checkpoint in %s; starting without %s", label, text, ENV)
            return ContainerEdits()
        inside = posixpath.join(text, name)
        log.info("%s: resuming from the newest complete checkpoint: %s=%s", label, ENV, inside)
        return ContainerEdits(env=((ENV, inside),))

    def _scan(self, label: str, work: Callable[[], Found]) -> Found | None:
        """`work` in a thread, waited for up to `timeout`; None (logged) when it fails."""
        if self._running is not None and self._running.is_alive():
            log.warning(
                "%s: no checkpoint resume: an earlier checkpoint scan has not ended (a hung "
                "file system?); none starts until it does",
                label,
            )
            return None
        outcome: list[Found | BaseException] = []

        def run() -> None:
            try:
                outcome.append(work())
            except Exception as e:  # whatever it is, the creation goes on
                outcome.append(e)

        thread = threading.Thread(target=run, name="hcsd-checkpoint-scan", daemon=True)
        try:
            thread.start()
        except RuntimeError as e:  # no thread to be had: the creation goes on without
            log.warning("%s: no checkpoint resume: failed to start the scan: %s", label, e)
            return None
        thread.join(self.settings.timeout)
        if thread.is_alive() or not outcome:
            self._running = thread
            log.warning(
                "%s: no checkpoint resume: the scan took longer than %.1f s "
                "(runtime.checkpoints.timeout)",
                label,
                self.settings.timeout,
            )
            return None
        if isinstance(outcome[0], BaseException):
            error = outcome[0]
            if isinstance(error, OSError | CheckpointError):
                why = error.strerror if isinstance(error, OSError) and error.strerror else error
                log.warning(
                    "%s: no checkpoint resume: failed to read its directory: %s", label, why
                )
            else:
                log.error("%s: no checkpoint resume: the scan failed", label, exc_info=error)
            return None
        return outcome[0]


def _newest(source: str, below: str, settings: CheckpointSection) -> Found:
    """Open the mount's source (as the runtime does), walk `below` without following a link,
    and find the newest complete checkpoint there. A directory not made yet holds none."""
    try:
        fd = open_dir(source, follow=True)
    except FileNotFoundError:
        return None, []
    try:
        for part in below.split("/") if below else ():
            try:
                child = open_dir(part, fd)
            except FileNotFoundError:
                return None, []
            os.close(fd)
            fd = child
        return newest_complete(fd, settings)
    finally:
        os.close(fd)
