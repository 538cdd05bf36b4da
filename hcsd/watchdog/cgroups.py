"""Which container a process belongs to, read from its cgroup as the runtime placed it.

Runtimes put each container in a cgroup whose last path component names its 64-hex id:
- cgroupfs driver (containerd, CRI-O, runc, cgroup v1 or v2): `/kubepods/burstable/pod<uid>/<id>`,
  `/k8s.io/<id>`, `/default/<id>`, `/docker/<id>`;
- systemd driver: `…/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`,
  `crio-<id>.scope`, `docker-<id>.scope`, `libpod-<id>.scope`, `runc-<id>.scope`.
CRI-O's and podman's monitors live in `crio-conmon-<id>.scope` / `libpod-conmon-<id>.scope`:
not the container, and not matched. A container with a writable cgroup of its own (cgroup v2
delegation) may create sub-cgroups with any name, so a path can name several ids; the caller
picks the outermost one that holds a grant (`owner`), which a container cannot forge from
inside its own subtree.

`/proc/<pid>/cgroup` lines are `hierarchy-id:controllers:path`; `0::path` is cgroup v2. The v2
line wins when it names a container (hybrid hosts list both), else the first v1 line that does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupMapper",
    "CgroupMount",
    "Membership",
    "container_ids",
    "container_path",
    "owner",
]

_COMPONENT = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|libpod|runc)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_MAX_FILE = 64 * 1024  # a cgroup file bigger than this is not one the kernel wrote


@dataclass(frozen=True, slots=True)
class Membership:
    """One line of /proc/<pid>/cgroup: the hierarchy ("" for v2, else its controllers)."""

    hierarchy: str
    path: str


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """A cgroup file system as mounted here; `root` is the mount's root inside the hierarchy.

    `options` are the v1 mount's super options (its controllers, `name=…`); empty for v2.
    """

    v2: bool
    options: frozenset[str]
    mount_point: str
    root: str

    def serves(self, hierarchy: str) -> bool:
        """Whether this mount shows the hierarchy of a /proc/<pid>/cgroup line."""
        if not hierarchy:
            return self.v2
        return not self.v2 and set(hierarchy.split(",")) <= self.options

    def directory(self, path: str) -> str | None:
        """The directory of cgroup `path` under this mount; None when the mount hides it."""
        root = self.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            return None
        return self.mount_point.rstrip("/") + path[len(root) :]


def container_ids(path: str) -> tuple[str, ...]:
    """The 64-hex container ids named by a cgroup path's components, outermost first."""
    return tuple(m["id"] for part in path.split("/") if (m := _COMPONENT.match(part)))


def container_path(path: str, container_id: str) -> str | None:
    """The part of a cgroup path that ends with the component naming `container_id`: the
    container's own cgroup, above whatever sub-cgroups it made."""
    parts = path.split("/")
    for index, part in enumerate(parts):
        match = _COMPONENT.match(part)
        if match is not None and match["id"] == container_id:
            return "/".join(parts[: index + 1])
    return None


def owner(
    ids: tuple[str, ...], held: Collection[str], members: Mapping[str, str] | None = None
) -> str | None:
    """The holder a process is charged to: the outermost id that holds a grant, or whose
    container belongs to a held DRA claim (`members`: container id -> the claim's key)."""
    for i in ids:
        if i in held:
            return i
        if members is not None and members.get(i, "") in held:
            return members[i]
    return None


class CgroupMapper:
    """Reads processes' cgroups under a /proc (the host's, for hcsd)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def memberships(self, pid: int) -> list[Membership] | None:
        """The process's cgroups; None when it is gone."""
        text = _read_small(self.proc / str(pid) / "cgroup")
        if text is None:
            return None
        found = []
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[2].startswith("/"):
                found.append(Membership(parts[1], parts[2]))
        return found

    def ids(self, pid: int) -> tuple[str, ...] | None:
        """Container ids in the process's cgroup path (v2 first); None when it is gone."""
        memberships = self.memberships(pid)
        if memberships is None:
            return None
        ordered = sorted(memberships, key=lambda m: m.hierarchy != "")
        for membership in ordered:
            if found := container_ids(membership.path):
                return found
        return ()

    def pids(self) -> Iterator[int]:
        """Every process under this /proc (for the scan when no cgroup directory is found)."""
        try:
            with os.scandir(self.proc) as entries:
                for entry in entries:
                    if entry.name.isdigit():
                        yield int(entry.name)
        except OSError:
            return

    def mounts(self) -> list[CgroupMount]:
        """cgroup (v1) and cgroup2 mounts seen by this process, from mountinfo."""
        text = _read_small(self.proc / "self" / "mountinfo", limit=1024 * 1024) or ""
        mounts = []
        for line in text.splitlines():
            fields = line.split(" ")
            if "-" not in fields:
                continue
            dash = fields.index("-")
            if len(fields) < dash + 4 or dash < 5:
                continue
            kind, options = fields[dash + 1], fields[dash + 3]
            root, point = _unescape(fields[3]), _unescape(fields[4])
            if kind in ("cgroup", "cgroup2"):
                names = frozenset(options.split(",")) if kind == "cgroup" else frozenset()
                mounts.append(CgroupMount(kind == "cgroup2", names, point, root))
        return mounts


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _read_small(path: Path, limit: int = _MAX_FILE) -> str | None:
    """A small kernel file in one read (os-level: this runs for every listed process)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # gone, or not ours to read
    try:
        chunks, size = [], 0
        while size < limit:  # seq files may hand out a long file in several reads
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
