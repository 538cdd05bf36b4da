"""A node's state in one process: a NodeService over a real ledger in a test's directory, and
the injector over it as hcsd builds one. What the API, NRI, refusal, injector, CDI and health
tests stand on when they need neither an hcsd process nor a container runtime.

The ledger writes through `DiskFull`, the real file system until a test fills the disk, so
any test can make the next ledger write fail with ENOSPC.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsd.discovery import Inventory
from hcsd.ledger import FileSystem, Ledger
from hcsd.runtime.injector import Injector, InjectorSettings
from hcsd.runtime.settings import RuntimeSection
from hcsd.service import NodeService

NODE_NAME = "sim"  # the name assignments must carry for this node


class DiskFull(FileSystem):
    """The real file system until `full` is set; then every write fails with ENOSPC."""

    def __init__(self) -> None:
        self.full = False

    def write(self, fd: int, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().write(fd, data)


@dataclass
class LocalNode:
    directory: Path
    ledger: Ledger
    service: NodeService
    disk: DiskFull

    @property
    def run_dir(self) -> Path:
        """Where the injector writes the per-container directories."""
        return self.directory / "run"

    def injector(
        self,
        *,
        libhcs: Path | None = None,
        clock: Callable[[], float] = time.time,
        **settings: Any,
    ) -> Injector:
        """An injector over this node's service, writing under `run_dir`; `settings` are
        InjectorSettings fields (assignment_key, keyring, …). Without `libhcs`, a
        placeholder file stands in for the library (these tests check edits, not libhcs)."""
        if libhcs is None:
            libhcs = self.directory / "libhcs.so"
            libhcs.write_bytes(b"\x7fELF")
        runtime = RuntimeSection(libhcs_path=str(libhcs))
        return Injector(
            self.service,
            InjectorSettings(NODE_NAME, str(self.run_dir), runtime, **settings),
            clock=clock,
        )

    def close(self) -> None:
        self.ledger.close()


def local_node(
    directory: Path,
    inventory: Inventory,
    *,
    clock: Callable[[], float] = time.time,
    disk: DiskFull | None = None,
) -> LocalNode:
    """The node's service over a ledger opened (replayed) in `directory`/state, writing
    through `disk` (a fresh DiskFull unless a test brings its own kind)."""
    disk = disk or DiskFull()
    ledger = Ledger(str(directory / "state"), fs=disk)
    ledger.open()
    return LocalNode(directory, ledger, NodeService(inventory, ledger, clock=clock), disk)
