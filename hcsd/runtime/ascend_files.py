"""The Ascend driver's files as Ascend Docker Runtime mounts them: the entries of its mount
list (`/etc/ascend-docker-runtime.d/base.list`, written by its installer for the card's
model: the driver's `lib64` and `include`, `/usr/local/dcmi`, `npu-smi`, and on some models
single libraries and config files), each bind-mounted read-only at the same path.

The list is root's configuration, like hcsd's own file: it is read (without following a link,
and checked again on the open descriptor) only when every component of its path is root's
alone (`trusted_path`), it is a regular file, and it holds at most MAX_BYTES and MAX_ENTRIES
(a longer list is refused whole, not cut). An entry is mounted only when it is a plain absolute
path inside the configured allowlist, both as written and with its links resolved, resolves
through components that are all root's alone, and is a regular file or a directory; a directory
that is a system tree (`/`, `/etc`, `/proc`, ...) is refused whatever the allowlist says.
Anything else is skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import stat

from hcsd.runtime.driver_settings import AscendDriverFiles
from hcsd.runtime.edits import MountEdit
from hcsd.runtime.trusted_path import UntrustedPath, resolve_trusted

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "ascend_list_mounts"]

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096
MAX_BYTES = 1 << 20
# Never mounted as directories: anything at or under the trees, and the dirs themselves.
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/root", "/home", "/var/lib")
_SYSTEM_DIRS = ("/", "/etc", "/usr", "/var", "/boot", "/lib", "/usr/lib", "/usr/local")


def ascend_list_mounts(files: AscendDriverFiles) -> list[MountEdit]:
    """The read-only mounts of the mount list's entries; none when there is no usable list."""
    if not files.mount_list or not os.path.lexists(files.mount_list):
        return []
    try:
        lines = _read_list(files.mount_list)
    except (OSError, UnicodeDecodeError, UntrustedPath) as e:
        log.warning("ignoring the Ascend mount list %r: %s", files.mount_list, e)
        return []
    mounts = []
    for line in lines:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if not os.path.isabs(entry) or os.path.normpath(entry) != entry:
            log.warning("skipping the Ascend mount list entry %r: not a plain absolute path", entry)
            continue
        if not os.path.lexists(entry):
            continue
        why = _refusal(entry, files.allowed)
        if isinstance(why, str):
            log.warning("skipping the Ascend mount list entry %r: %s", entry, why)
            continue
        mounts.append(MountEdit(why[0], entry))
    return mounts


def _read_list(path: str) -> list[str]:
    """The list's lines; UntrustedPath (or OSError) when it is not root's alone or too long."""
    real, st = resolve_trusted("/", path)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise UntrustedPath("it changed while being opened")
        if not stat.S_ISREG(opened.st_mode):
            raise UntrustedPath("not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UntrustedPath(f"larger than {MAX_BYTES} bytes")
    lines = data.decode("utf-8").splitlines()
    if len(lines) > MAX_ENTRIES:
        raise UntrustedPath(f"more than {MAX_ENTRIES} lines")
    return lines


def _refusal(entry: str, allowed: tuple[str, ...]) -> str | tuple[str]:
    """(the resolved host path,) for a mountable entry, or why it is refused."""
    try:
        real, st = resolve_trusted("/", entry)
    except UntrustedPath as e:
        return f"not root's alone: {e}"
    if not (_allowed(entry, allowed) and _allowed(real, allowed)):
        return f"{real} is outside the allowed paths"
    if stat.S_ISDIR(st.st_mode):
        if real in _SYSTEM_DIRS or any(_under(real, t) for t in _SYSTEM_TREES):
            return f"{real} is a system directory"
    elif not stat.S_ISREG(st.st_mode):
        return "neither a regular file nor a directory"
    return (real,)


def _allowed(path: str, allowed: tuple[str, ...]) -> bool:
    """`path` is one of the `allowed` (a prefix ending in "/": at or under that directory)."""
    return any(_under(path, a.rstrip("/")) if a.endswith("/") else path == a for a in allowed)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")
