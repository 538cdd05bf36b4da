"""Real cgroups for the watchdog tests, laid out as runtimes lay out containers' cgroups.

`Containers(base)` makes `<mount>/<base>/kubepods/pod<uid>/<64-hex id>` in the cgroup v2
hierarchy and in the v1 `pids` hierarchy where they are mounted (a hybrid host such as this
one has both, and runc joins both), starts processes inside with `spawn`, and on `close` kills
what is left in them and removes every directory it made. Needs root.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hcsd.watchdog.cgroups import CgroupMapper
from tests.harness import cgroups

__all__ = ["Container", "Containers", "cgroup_roots"]


def cgroup_roots() -> list[Path]:
    """Writable mount points to create test cgroups under: cgroup2, and v1 `pids`."""
    roots = []
    for mount in CgroupMapper().mounts():
        if mount.root != "/":
            continue
        if mount.v2 or "pids" in mount.options:
            path = Path(mount.mount_point)
            if os.access(path, os.W_OK):
                roots.append(path)
    return roots


class Container:
    def __init__(self, container_id: str, directories: Sequence[Path]) -> None:
        self.id = container_id
        self.directories = list(directories)
        self.processes: list[subprocess.Popen[bytes]] = []

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        sub: str = "",
        stdout: int | None = subprocess.PIPE,
    ) -> subprocess.Popen[bytes]:
        """Start a process already inside the cgroup, optionally in a sub-cgroup `sub` that
        the container made for itself. A shell joins the cgroup and execs the command, as a
        runtime's init does: no Python runs between fork and exec (this process has threads,
        and gRPC's fork handlers must not run in a child that writes to a cgroup)."""
        targets = [d / sub if sub else d for d in self.directories]
        for target in targets:
            target.mkdir(exist_ok=True)
        procs = " ".join(shlex.quote(str(t / "cgroup.procs")) for t in targets)
        join = f'for p in {procs}; do echo $$ > "$p" || exit 97; done; exec "$@"'
        process = subprocess.Popen(
            ["/bin/sh", "-c", join, "sh", *argv],
            env=dict(env) if env is not None else None,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        deadline = time.monotonic() + 10
        while not all(str(process.pid) in _read(t / "cgroup.procs").split() for t in targets):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not join {targets}")
            time.sleep(0.001)
        return process

    def pids(self) -> set[int]:
        return cgroups.processes(self.directories)


class Containers:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.base = f"hcs-watchdog-test-{secrets.token_hex(4)}"
        self.roots = list(roots)
        self.made: list[Container] = []

    def new(self, container_id: str | None = None, *, pod: str = "pod0") -> Container:
        cid = container_id or secrets.token_hex(32)
        directories = []
        for root in self.roots:
            path = root / self.base / "kubepods" / f"pod{pod}" / cid
            path.mkdir(parents=True, exist_ok=True)
            directories.append(path)
        container = Container(cid, directories)
        self.made.append(container)
        return container

    def close(self) -> None:
        for container in self.made:
            for process in container.processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
            for pid in container.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for root in self.roots:
            # A cgroup goes once its last (possibly just killed) process is reaped.
            left = cgroups.remove_tree(root / self.base, retry_for=2.0)
            if left:
                raise OSError(f"cannot remove the test cgroups: {'; '.join(left)}")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
