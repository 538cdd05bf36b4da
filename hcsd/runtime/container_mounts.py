"""Which host directory a path in a container is, from the container's mounts as NRI sends them.

containerd's CRI orders a container's mounts parents first, so at a path the deepest mount
whose destination holds it is what the container sees (of two at the same destination, the
later). That mount must be a bind of a host directory: a tmpfs, a proc or any other mount there
means the host holds nothing the container sees. Mounts below the path cover some of its
entries: those names are `shadowed` (what hcsd would read there is not what the container
reads), whatever the mount below them is.

The host source is opened from `/` one component at a time with `O_NOFOLLOW`: the runtime
resolves a link in it when it bind-mounts, but hcsd, as root, reads the tenant's directory only
at the exact path the kubelet gave, never wherever a link there points now.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from hcsd.runtime.dirfd import open_dir

__all__ = ["ContainerMount", "Located", "MountError", "locate", "open_source"]


class MountError(ValueError):
    """The path is not a host directory the container sees; the message says why."""


@dataclass(frozen=True, slots=True)
class ContainerMount:
    """One mount of the container as the runtime has it."""

    destination: str  # in the container
    source: str  # on the host, for a bind
    bind: bool = True  # a bind of a host path (else tmpfs, proc, an overlay …)
    kind: str = "bind"  # the mount type, for the log


@dataclass(frozen=True, slots=True)
class Located:
    """The bind mount that holds a path, the path below its source, and the entries of that
    directory that mounts below it cover."""

    mount: ContainerMount
    below: str  # "" for the source itself
    shadowed: frozenset[str]


def _holds(destination: str, path: str) -> bool:
    return destination in ("/", path) or path.startswith(destination + "/")


def locate(path: str, mounts: Iterable[ContainerMount]) -> Located:
    """Where `path` (absolute, normal form) lives on the host. Raises MountError when it is in
    no mount, or the mount that holds it is not a bind of a host directory."""
    mounts = [m for m in mounts if m.destination.startswith("/")]
    best: tuple[ContainerMount, str] | None = None
    for mount in mounts:
        destination = posixpath.normpath(mount.destination)
        if _holds(destination, path) and (best is None or len(destination) >= len(best[1])):
            best = (mount, destination)
    if best is None:
        raise MountError(f"{path!r} is in none of the container's mounts")
    mount, destination = best
    if not mount.bind or not os.path.isabs(mount.source):
        raise MountError(
            f"{path!r} is on a {mount.kind} mount at {destination!r}, not a host directory"
        )
    below = "" if path == destination else path[len(destination.rstrip("/")) + 1 :]
    shadowed = set()
    for other in mounts:
        inner = posixpath.normpath(other.destination)
        if inner != path and _holds(path, inner):
            shadowed.add(inner[len(path.rstrip("/")) + 1 :].split("/")[0])
    return Located(mount, below, frozenset(shadowed))


def open_source(source: str) -> int:
    """A descriptor of the host directory `source`, opened from `/` one component at a time,
    no link followed. Raises MountError (a link on the way, a path not in normal form) or
    OSError."""
    parts = [p for p in source.split("/") if p]
    if not source.startswith("/") or any(p in (".", "..") for p in parts):
        raise MountError(
            f"failed to open the mount source {source!r}: not an absolute path in normal form"
        )
    fd = open_dir("/", follow=True)
    try:
        for part in parts:
            try:
                child = open_dir(part, fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, fd):
                    raise MountError(
                        f"failed to open the mount source {source!r}: {part!r} in it is a "
                        "symbolic link, not followed"
                    ) from e
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
