"""Ledger errors, split by what the caller should do about them.

The three that refuse one request are also `Refusal`s, so that they reach every front end with
their reason and status unchanged: OverCapacity and LedgerConflict are permanent (the request
is wrong for the current state), LedgerWriteError is temporary (disk full, I/O error: nothing
was changed and the same request may succeed later). LedgerCorrupt and LedgerLocked refuse no
request: they stop the daemon from starting on state it cannot trust.
"""

from __future__ import annotations

from hcsd.refusals import Reason, Refusal


class LedgerError(Exception):
    """Base of all ledger errors."""


class OverCapacity(LedgerError, Refusal):
    """The allocation would put a device past its VRAM or compute capacity."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.OVER_CAPACITY, message)


class LedgerConflict(LedgerError, Refusal):
    """The container already holds a different allocation."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.CONFLICT, message)


class LedgerWriteError(LedgerError, Refusal):
    """The record could not be made durable; nothing was changed. Retry later."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.WRITE_FAILED, message)


class LedgerCorrupt(LedgerError):
    """A record in the middle of the journal, or the snapshot, fails its checksum.

    Never reset silently: the operator must look (the message names the file and offset).
    """


class LedgerLocked(LedgerError):
    """Another process holds the state directory."""
