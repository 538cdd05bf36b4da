"""A node's private mount namespace: its own /etc/hcsd, /run/hcsd, /var/lib/kubelet, driver
directories and device nodes, while every other path is the host's.

Two kubelets on one host collide on paths they hard-code whatever `--root-dir` says (the
device-plugin socket under /var/lib/kubelet, /var/log/containers), and hcsd's defaults are
host-wide paths other tests share. A holder process (`unshare -m --propagation private`)
keeps the namespace; the node's daemons join it with nsenter, so containerd sees kubelet's
volume mounts. A private path that exists on the host gets a scratch directory bound over
it; one that does not has its parent replaced, in this namespace only, by a tmpfs holding
bind mounts of the parent's entries plus the new one (nothing is created on the host).
The namespace, and every mount in it, goes when its last process ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Replace directory $1 by a tmpfs ($2 is where it is assembled) holding its entries.
SHADOW = r"""
shadow() {
  mkdir -p "$2"; mount -t tmpfs -o mode=0755 hcs-shadow "$2"
  for e in "$1"/* "$1"/.[!.]*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n="${e##*/}"
    if [ -L "$e" ]; then cp -P "$e" "$2/$n"
    elif [ -d "$e" ]; then mkdir "$2/$n"; mount --rbind "$e" "$2/$n"
    else : > "$2/$n"; mount --bind "$e" "$2/$n"; fi
  done
  mount --move "$2" "$1"
}
"""


@dataclass(frozen=True)
class Bind:
    """`source` (a host path) seen at `target` inside the namespace."""

    target: str
    source: Path


class MountNamespace:
    """Start with `start()`; `enter` prefixes a command that runs inside."""

    def __init__(self, scratch: Path, binds: Sequence[Bind]) -> None:
        self.scratch = scratch
        self.binds = list(binds)
        self.holder: subprocess.Popen[str] | None = None

    def script(self) -> str:
        lines = ["set -e", SHADOW]
        shadowed: set[str] = set()
        for bind in self.binds:
            parent = str(Path(bind.target).parent)
            if not os.path.lexists(bind.target) and parent not in shadowed:
                staging = self.scratch / "shadows" / parent.strip("/").replace("/", "_")
                lines.append(f"shadow {parent} {staging}")
                shadowed.add(parent)
        for bind in self.binds:
            make = "mkdir -p" if bind.source.is_dir() else ": >"
            lines.append(f"[ -e {bind.target} ] || {make} {bind.target}")
            lines.append(f"mount --bind {bind.source} {bind.target}")
        lines += ["echo ready", "exec sleep infinity"]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        script = self.scratch / "namespace.sh"
        script.write_text(self.script())
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert self.holder.stdout is not None
        first = self.holder.stdout.readline()
        if first.strip() != "ready":
            rest = first + (self.holder.stdout.read() if self.holder.poll() is not None else "")
            raise RuntimeError(f"failed to set up the node's mount namespace: {rest}")

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    @property
    def enter(self) -> list[str]:
        """Prefix for a command that runs in this namespace."""
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--"]

    def identity(self) -> str:
        return os.readlink(f"/proc/{self.pid}/ns/mnt")

    def processes(self) -> list[int]:
        """Every process in this namespace but the holder (the node's daemons, shims)."""
        if self.holder is None or self.holder.poll() is not None:
            return []
        ours = self.identity()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == ours:
                    found.append(int(entry.name))
        return found

    def close(self) -> list[int]:
        """Kill what is left in the namespace (it all started here), then the holder; the
        pids that had to be killed, for the caller to report."""
        left = self.processes()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(5)
        return left
