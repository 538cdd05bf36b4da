"""The per-container directory libhcs reads: `quota.conf`, and beside it the accounting region.

Host side `<run_dir>/containers/<container-id>/`, mounted read-write at `/run/hcs` inside the
container (libhcs creates `usage.shm` there, shared by the container's processes). libhcs
itself is mounted read-only, and `/etc/ld.so.preload` is bind-mounted read-only over the
container's own, so a process inside cannot unset the preload. The file format is the contract
in docs/libhcs.md, written by hcsd.contract.quota_file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence

from hcsd.contract import paths
from hcsd.contract.names import CONTAINER_ID
from hcsd.contract.quota_file import render_quota
from hcsd.ledger.fs import OsFileSystem, write_atomic
from hcsd.model import Device, Grant
from hcsd.runtime.edits import ContainerEdits, MountEdit

__all__ = ["CONTAINER_DIR", "LIBHCS_IN_CONTAINER", "QuotaFiles"]

CONTAINER_DIR = paths.CONTAINER_DIR
LIBHCS_IN_CONTAINER = paths.LIBHCS_IN_CONTAINER


class QuotaFiles:
    def __init__(self, run_dir: str, libhcs_path: str) -> None:
        self.root = os.path.join(run_dir, "containers")
        self.libhcs_path = libhcs_path
        self.preload_file = os.path.join(run_dir, "ld.so.preload")

    def directory(self, container_id: str) -> str:
        if not CONTAINER_ID.fullmatch(container_id):
            raise ValueError(f"container id {container_id!r} is not a safe directory name")
        return os.path.join(self.root, container_id)

    def prepare(
        self, container_id: str, grants: Sequence[Grant], devices: Sequence[Device]
    ) -> ContainerEdits:
        """Write the quota file (atomically) and return the edits that expose it."""
        if not os.path.isfile(self.libhcs_path):
            # Refuse now with the reason, rather than hand the runtime a mount that fails at
            # start with a bare stat error, or run the container without its quota.
            raise FileNotFoundError(
                f"libhcs is not installed at {self.libhcs_path}; the VRAM quota cannot be enforced"
            )
        directory = self.directory(container_id)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fs = OsFileSystem()
        write_atomic(
            fs,
            os.path.join(directory, "quota.conf"),
            render_quota(container_id, grants, devices).encode(),
        )
        preload = self.preload_edits()
        return ContainerEdits(
            env=(("HCS_CONFIG", paths.CONTAINER_QUOTA_FILE),),
            mounts=(MountEdit(directory, CONTAINER_DIR, read_only=False), *preload.mounts),
        )

    def preload_edits(self) -> ContainerEdits:
        """libhcs and the preload file that loads it, read-only (writes the file if missing):
        the part of the quota edits that is the same for every container (the CDI spec's too)."""
        if not os.path.exists(self.preload_file):
            os.makedirs(os.path.dirname(self.preload_file), mode=0o755, exist_ok=True)
            write_atomic(OsFileSystem(), self.preload_file, f"{LIBHCS_IN_CONTAINER}\n".encode())
        return ContainerEdits(
            mounts=(
                MountEdit(self.libhcs_path, LIBHCS_IN_CONTAINER),
                MountEdit(self.preload_file, paths.PRELOAD_FILE),
            )
        )

    def remove(self, container_id: str) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            shutil.rmtree(self.directory(container_id))

    def present(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
