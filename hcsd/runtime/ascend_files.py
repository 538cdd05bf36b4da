"""The Ascend driver's files as Ascend Docker Runtime mounts them: the entries of its mount
list (`/etc/ascend-docker-runtime.d/base.list`, written by its installer for the card's
model: the driver's `lib64` and `include`, `/usr/local/dcmi`, `npu-smi`, and on some models
single libraries and config files), each bind-mounted read-only at the same path.

The list is root's configuration, like hcsd's own file: it is read only when it is a regular
file owned by root that no group or other user may write. Each entry must be an absolute path
that exists and, with its links resolved, is owned by root and not writable by others (the
same rule the vendor's runtime applies to links); anything else is skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import stat

from hcsd.runtime.driver_settings import AscendDriverFiles
from hcsd.runtime.edits import MountEdit

__all__ = ["ascend_list_mounts"]

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096


def ascend_list_mounts(files: AscendDriverFiles) -> list[MountEdit]:
    """The read-only mounts of the mount list's entries; none when there is no usable list."""
    if not files.mount_list or not os.path.exists(files.mount_list):
        return []
    if not _roots(files.mount_list, regular=True):
        log.warning("ignoring the Ascend mount list %s: not a root-owned file", files.mount_list)
        return []
    try:
        with open(files.mount_list, encoding="utf-8") as f:
            lines = f.read(1 << 20).splitlines()[:MAX_ENTRIES]
    except (OSError, UnicodeDecodeError) as e:
        log.warning("ignoring the Ascend mount list %s: %s", files.mount_list, e)
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
        real = os.path.realpath(entry)
        if not _roots(entry, regular=False) or not _roots(real, regular=False):
            log.warning("skipping the Ascend mount list entry %s: not root's alone", entry)
            continue
        mounts.append(MountEdit(real, entry))
    return mounts


def _roots(path: str, *, regular: bool) -> bool:
    """`path` (not followed) is owned by root, not writable by group or others, and a regular
    file (`regular`) or a file or directory (else; a link counts by its owner)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kinds = (
        (stat.S_ISREG(st.st_mode),)
        if regular
        else (
            stat.S_ISREG(st.st_mode),
            stat.S_ISDIR(st.st_mode),
            stat.S_ISLNK(st.st_mode),
        )
    )
    writable = not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return any(kinds) and st.st_uid == 0 and not writable
