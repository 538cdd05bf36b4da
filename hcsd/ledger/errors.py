"""Ledger errors, split by what the caller should do about them.

Permanent refusals (OverCapacity, LedgerConflict) mean the request is wrong for the current
state; LedgerWriteError is temporary (disk full, I/O error) and the same request may succeed
later; LedgerCorrupt and LedgerLocked stop the daemon from starting on state it cannot trust.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of all ledger errors."""


class OverCapacity(LedgerError):
    """The allocation would put a device past its VRAM or compute capacity."""

    reason = "over_capacity"


class LedgerConflict(LedgerError):
    """The container already holds a different allocation."""

    reason = "conflict"


class LedgerWriteError(LedgerError):
    """The record could not be made durable; nothing was changed. Retry later."""

    reason = "write_failed"


class LedgerCorrupt(LedgerError):
    """A record in the middle of the journal, or the snapshot, fails its checksum.

    Never reset silently: the operator must look (the message names the file and offset).
    """


class LedgerLocked(LedgerError):
    """Another process holds the state directory."""
