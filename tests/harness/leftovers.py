"""What the leftover checks after containers end have in common, wherever they run (a
containerd of the runtime tests, a kubelet node): mounts naming the containers, processes
still in their cgroups or still running, each process named by its command line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.harness import cgroups


def mounts_naming(needles: Iterable[str], pid: int | str = "self") -> list[str]:
    """The mount points, in the mount namespace of `pid`, whose mountinfo line names any of
    `needles` (a container's id, a pod's uid, a directory of ours)."""
    wanted = [n for n in needles if n]
    try:
        table = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:  # the namespace's process is gone
        return []
    return [line.split()[4] for line in table.splitlines() if any(n in line for n in wanted)]


def processes_in(directories: Iterable[Path]) -> list[int]:
    """The processes still in these cgroups (or below), sorted."""
    return sorted(cgroups.processes(directories))


def running(pid: int) -> bool:
    """The pid exists and is not a zombie (containerd's shim reaps its children)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def command(pid: int) -> str:
    """`PID argv…`, or the pid alone once the process is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    return f"{pid} " + " ".join(a.decode(errors="replace") for a in argv)
