"""The host's cgroup trees as the tests make, read and remove them, in every mounted
hierarchy: the v1 controllers, `name=systemd` and the unified one of a hybrid host (the
machines these tests were written on), or the one cgroup2 mount of a v2-only host.

Used by the kubelet nodes (a `cgroupRoot` each), containerd's cleanup, the watchdog's test
containers and the leftover checks; only the trees a test made are ever removed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """Every mounted hierarchy: the mounts under ROOT, or ROOT itself when it is the one
    cgroup2 mount (a v2-only host)."""
    if os.path.ismount(ROOT) and (ROOT / "cgroup.controllers").exists():
        return [ROOT]
    return sorted(p for p in ROOT.iterdir() if p.is_dir() and os.path.ismount(p))


def of_process(pid: int) -> list[Path]:
    """The cgroup directories a process is in, one per hierarchy, from /proc/PID/cgroup (the
    root cgroup left out)."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path == "/":
            continue
        if not controllers:  # the unified hierarchy: its own mount on a hybrid host
            hierarchy = ROOT / "unified" if (ROOT / "unified").is_dir() else ROOT
        else:
            hierarchy = ROOT / controllers.removeprefix("name=")
        found.append(hierarchy / path.lstrip("/"))
    return found


def processes(directories: Iterable[Path]) -> set[int]:
    """The processes in these cgroups and every cgroup below them."""
    found: set[int] = set()
    for directory in directories:
        for procs in directory.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):  # removed meanwhile
                found.update(int(p) for p in procs.read_text().split())
    return found


def remove_tree(root: Path, *, retry_for: float = 0.0) -> list[str]:
    """rmdir `root` and everything below it, bottom-up; what would not go. A cgroup goes only
    once its last process is reaped: each directory is retried for `retry_for` seconds."""
    if not root.exists():
        return []
    left = []
    below = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for directory in [*below, root]:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    left.append(f"{directory}: {e.strerror}")
                    break
                time.sleep(0.02)
    return left
