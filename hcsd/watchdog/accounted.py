"""What libhcs accounted for a container: the `used[]` totals of its shared usage region.

libhcs keeps `usage.shm` beside the container's quota.conf (docs/libhcs.md): a header with the
magic "HCSREGN1", a version, the number of device slots at offset 12 and, from offset 32, one
little-endian u64 per device ordinal with the container's usage, the ordinal being the grant's
position in quota.conf. Only that header is read (its layout is the documented contract; the
process slots behind it are libhcs's business).

The container writes the file (its mount at /run/hcs/usage.shm; an older hcsd mounted the
whole directory): it is looked up without following links, must be a regular file before it
is opened for reading, and only its first bytes are read. A missing, foreign or malformed file
reads as "unknown", never as zero, so a container that deleted its region does not look as
though it used nothing.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from hcsd.contract.names import container_id_problem
from hcsd.model import Allocation
from hcsd.runtime.claims import CLAIM_SOURCE, CLAIMS_DIR

__all__ = ["AccountedUsage"]

MAGIC = 0x4843535245474E31
USED_OFFSET = 32
MAX_SLOTS = 64


class AccountedUsage:
    """Reads `<run_dir>/containers/<id>/usage.shm` for the containers hcsd prepared, and
    `<run_dir>/claims/claim-<uid>/usage.shm` for DRA claims (shared by their containers)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir) / "containers"
        self.claims = Path(run_dir) / CLAIMS_DIR

    def __call__(self, allocation: Allocation) -> dict[str, int] | None:
        """Bytes libhcs accounted per device uuid; None when there is no usable region."""
        if container_id_problem(allocation.container_id) is not None:  # as the runtime names dirs
            return None
        root = self.claims if allocation.source == CLAIM_SOURCE else self.root
        directory = str(root / allocation.container_id)
        data = _read_head(directory, "usage.shm", USED_OFFSET + 8 * MAX_SLOTS)
        if data is None or len(data) < USED_OFFSET:
            return None
        magic, version, slots = struct.unpack_from("<QII", data)
        if magic != MAGIC or version < 1 or not 0 < slots <= MAX_SLOTS:
            return None
        if len(data) < USED_OFFSET + 8 * slots:
            return None
        used = struct.unpack_from(f"<{slots}Q", data, USED_OFFSET)
        return {
            grant.device_uuid: used[ordinal]
            for ordinal, grant in enumerate(allocation.grants)
            if ordinal < slots
        }


def _read_head(directory: str, name: str, size: int) -> bytes | None:
    """The first bytes of a regular file the container may have replaced by anything.

    Opened as O_PATH without following links and checked to be a regular file before any real
    open: opening a device node a container planted there (it may hold CAP_MKNOD) could have
    side effects. The checked inode is then reopened through /proc/self/fd, which cannot race.
    """
    try:
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(path_fd).st_mode):
            return None
        fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(path_fd)
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
