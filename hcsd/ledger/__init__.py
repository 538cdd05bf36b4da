"""The node's crash-safe record of who holds which slice of which device."""

from hcsd.fs import FileSystem, OsFileSystem
from hcsd.ledger.errors import (
    LedgerConflict,
    LedgerCorrupt,
    LedgerError,
    LedgerLocked,
    LedgerWriteError,
    OverCapacity,
)
from hcsd.ledger.ledger import Ledger

__all__ = [
    "FileSystem",
    "Ledger",
    "LedgerConflict",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerLocked",
    "LedgerWriteError",
    "OsFileSystem",
    "OverCapacity",
]
