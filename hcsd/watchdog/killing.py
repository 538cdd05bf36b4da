"""SIGKILL for every process of one container, and for no process outside it.

The processes come from the container's own cgroup (`cgroup.procs` of its directory and every
sub-cgroup, in each hierarchy mounted here), found from the cgroup of a process seen on the
device; where no such directory can be found (cgroup file systems not mounted in hcsd's mount
namespace), from a scan of /proc. Either way each process is opened as a pidfd first and its
cgroup read again through /proc before the signal goes through that pidfd: a pid reused by
another process between listing and killing is never signalled, and a process that is not the
container's (its cgroup path must name the container, and the caller's rule that charged the
container must agree) is never signalled; a zombie, dead already, is left to its parent.

Rounds repeat until a round finds nothing new, so children forked while the first signals
flew are caught too (bounded: a fork bomb in a container is the runtime's to stop).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hcsd.watchdog.cgroups import CgroupMapper, container_path

__all__ = ["KillReport", "Killer"]

log = logging.getLogger(__name__)

MAX_CGROUPS = 4096  # sub-cgroups walked below one container's directory


@dataclass(frozen=True, slots=True)
class KillReport:
    killed: tuple[int, ...]
    source: str  # "cgroup" (its cgroup.procs) or "proc" (a scan of /proc)


class Killer:
    def __init__(self, mapper: CgroupMapper, *, rounds: int = 8) -> None:
        self.mapper = mapper
        self.rounds = rounds

    def kill(
        self, container_id: str, seeds: Iterable[int], belongs: Callable[[int], bool]
    ) -> KillReport:
        """SIGKILL the container's processes; `belongs(pid)` is checked on each through its
        pidfd. `seeds` are pids known to be in it (those seen on the device)."""
        directories = self.directories(container_id, seeds)
        source = "cgroup" if directories else "proc"
        checked: set[int] = {0, 1, os.getpid()}
        killed: list[int] = []
        for _ in range(self.rounds):
            candidates = (
                self._listed(directories) if directories else set(self.mapper.pids())
            ) - checked
            if not candidates:
                break
            for pid in sorted(candidates):
                checked.add(pid)
                if _kill(pid, lambda p: self._inside(p, container_id) and belongs(p)):
                    killed.append(pid)
        return KillReport(tuple(killed), source)

    def directories(self, container_id: str, seeds: Iterable[int]) -> set[str]:
        """The container's cgroup directory in every hierarchy mounted here."""
        mounts = self.mapper.mounts()
        found = set()
        for pid in seeds:
            for membership in self.mapper.memberships(pid) or ():
                path = container_path(membership.path, container_id)
                if path is None:
                    continue
                for mount in mounts:
                    if not mount.serves(membership.hierarchy):
                        continue
                    directory = mount.directory(path)
                    if directory is not None and os.path.isdir(directory):
                        found.add(directory)
        return found

    def _inside(self, pid: int, container_id: str) -> bool:
        """Alive, and its cgroup path names the container: checked here whatever `belongs`
        says, so that no caller's mistake can reach a process outside the container."""
        ids = self.mapper.ids(pid)
        if ids is None or container_id not in ids:
            return False
        try:
            with open(self.mapper.proc / str(pid) / "stat", "rb") as f:
                stat = f.read(4096)
        except OSError:
            return False
        return stat.rpartition(b")")[2][:3] != b" Z "  # a zombie is dead already

    def _listed(self, directories: Iterable[str]) -> set[int]:
        pids: set[int] = set()
        for top in directories:
            walked = 0
            for directory, _subdirs, _files in os.walk(top):
                walked += 1
                if walked > MAX_CGROUPS:
                    log.warning("kill: more than %d cgroups under %s", MAX_CGROUPS, top)
                    break
                try:
                    with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                        text = f.read(4 * 1024 * 1024)
                except OSError:
                    continue  # removed while we walked
                pids.update(int(word) for word in text.split() if word.isdigit())
        return pids


def _kill(pid: int, belongs: Callable[[int], bool]) -> bool:
    """SIGKILL through a pidfd after checking, through /proc, that it is the container's
    (the check runs after the pidfd is open, so it is about the process the pidfd names)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError as e:
        log.warning("kill: cannot open pid %d (%s); not signalled", pid, e.strerror)
        return False
    try:
        if not belongs(pid):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
