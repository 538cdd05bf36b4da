"""The ledger: allocations kept in memory, made durable in an fsync'd journal before any ack.

Besides allocations it keeps one small record per pod whose scheduler assignment this node
accepted (`Acceptance`: pod uid, digest of the annotation, when), so that the pod's later
containers are accepted on day 8 and after a key retirement (hcsd/runtime/acceptance.py).

Files in the state directory:
- `journal`: framed msgpack records, one per operation, each with a sequence number;
- `snapshot`: the whole state at some sequence number, written atomically;
- `lock`: flock'd while a process owns the directory, so two daemons never share it.

Compaction writes a snapshot at sequence S, then replaces the journal with an empty one.
A crash between the two leaves an old journal whose records all have sequence <= S, which
replay skips, so every order of crash points gives the same state.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.fs import FileSystem, OsFileSystem, write_atomic
from hcsd.ledger import codec
from hcsd.ledger.capacity import Capacity, check_capacity
from hcsd.ledger.errors import (
    LedgerConflict,
    LedgerCorrupt,
    LedgerError,
    LedgerLocked,
    LedgerWriteError,
)
from hcsd.ledger.framing import (
    JOURNAL_HEADER,
    SNAPSHOT_MAGIC,
    frame,
    scan_journal,
    snapshot_bytes,
    unframe_one,
)
from hcsd.model import Acceptance, Allocation
from hcsd.quantity import format_bytes
from hcsd.sections import Section, checks, setting

__all__ = ["Capacity", "Ledger", "LedgerSection", "ReplayReport"]

log = logging.getLogger(__name__)

_ALLOCATE = "a"
_RELEASE = "r"
_ACCEPT = "p"  # a pod's assignment accepted
_FORGET = "x"  # a gone pod's acceptance dropped


@dataclass(frozen=True, slots=True)
class LedgerSection(Section):
    """`[ledger]`: when the journal is folded into a snapshot (the directory is
    `daemon.state_dir`)."""

    compact_after: int = setting(
        10_000,
        "Journal records after which the ledger writes a snapshot and starts afresh.",
        checks.positive_int,
    )


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What opening the ledger found, for the start-up log line and for tests."""

    snapshot_seq: int
    records: int
    torn_bytes: int
    allocations: int


class Ledger:
    """Who holds which slice of which device, durable across `kill -9`.

    Not thread-safe by design: the daemon calls it from its event loop only, which also gives
    every operation a total order.
    """

    def __init__(
        self,
        state_dir: str,
        settings: LedgerSection | None = None,
        *,
        fs: FileSystem | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.fs = fs or OsFileSystem()
        self.compact_after = (settings or LedgerSection()).compact_after
        self._journal_path = os.path.join(state_dir, "journal")
        self._snapshot_path = os.path.join(state_dir, "snapshot")
        self._allocations: dict[str, Allocation] = {}
        self._accepted: dict[str, Acceptance] = {}
        self._vram_used: dict[str, int] = {}
        self._compute_used: dict[str, int] = {}
        self._capacity: dict[str, Capacity] = {}
        self._seq = 0
        self._records_since_snapshot = 0
        self._fd = -1
        self._lock_fd = -1
        self._end = 0
        self._broken: str | None = None
        self.report = ReplayReport(0, 0, 0, 0)

    # -- life cycle -------------------------------------------------------------------------

    def open(self) -> ReplayReport:
        """Take the directory lock, load the snapshot, replay the journal, drop a torn tail."""
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        self._lock()
        try:
            return self._replay()
        except BaseException:
            self.close()  # a refused state directory is not left locked by this process
            raise

    def _replay(self) -> ReplayReport:
        snapshot_seq = self._load_snapshot()
        data = self.fs.read(self._journal_path) or b""
        scan = scan_journal(data, self._journal_path, codec.payload_size)
        replayed = 0
        for position, payload in enumerate(scan.payloads):
            try:
                record = codec.decode(payload)
                seq = int(record["s"])
                if seq <= self._seq:
                    continue  # already in the snapshot (crash during compaction)
                self._apply(record)
            except (ValueError, KeyError, TypeError) as e:
                raise LedgerCorrupt(
                    f"{self._journal_path}: record #{position} cannot be decoded: {e}"
                ) from e
            self._seq = seq
            replayed += 1
        self._fd = self.fs.open_append(self._journal_path)
        if scan.torn_bytes:
            log.warning(
                "ledger: dropping %d torn byte(s) at the end of %s (a crash mid-write)",
                scan.torn_bytes,
                self._journal_path,
            )
        if scan.torn_bytes or scan.valid_end == 0:
            self.fs.truncate(self._fd, scan.valid_end)
            if scan.valid_end == 0:
                self.fs.write(self._fd, JOURNAL_HEADER)
            self.fs.sync(self._fd)
        self._end = self.fs.size(self._fd)
        self._records_since_snapshot = len(scan.payloads)
        self.report = ReplayReport(snapshot_seq, replayed, scan.torn_bytes, len(self._allocations))
        return self.report

    def close(self) -> None:
        if self._fd >= 0:
            self.fs.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _lock(self) -> None:
        path = os.path.join(self.state_dir, "lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LedgerLocked(
                f"state directory {self.state_dir} is in use by another process"
            ) from None
        self._lock_fd = fd

    def _load_snapshot(self) -> int:
        data = self.fs.read(self._snapshot_path)
        if data is None:
            return 0
        payload = unframe_one(data, SNAPSHOT_MAGIC, self._snapshot_path)
        try:
            record = codec.decode(payload)
            self._seq = int(record["s"])
            for raw in record["allocations"]:
                self._insert(codec.decode_allocation(raw))
            for raw in record.get("accepted", ()):  # absent in snapshots of older builds
                self._accept(codec.decode_acceptance(raw))
        except (ValueError, KeyError, TypeError) as e:
            raise LedgerCorrupt(f"{self._snapshot_path}: cannot be decoded: {e}") from e
        return self._seq

    # -- queries ----------------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """Sequence number of the last durable operation."""
        return self._seq

    def allocations(self) -> list[Allocation]:
        return sorted(self._allocations.values(), key=lambda a: (a.created, a.container_id))

    def get(self, container_id: str) -> Allocation | None:
        return self._allocations.get(container_id)

    def acceptance(self, pod_uid: str) -> Acceptance | None:
        return self._accepted.get(pod_uid)

    def acceptances(self) -> list[Acceptance]:
        return sorted(self._accepted.values(), key=lambda a: (a.accepted_at, a.pod_uid))

    def vram_used(self, device_uuid: str) -> int:
        return self._vram_used.get(device_uuid, 0)

    def compute_used(self, device_uuid: str) -> int:
        return self._compute_used.get(device_uuid, 0)

    def set_capacities(self, capacities: Mapping[str, Capacity]) -> None:
        """Tell the ledger what each device can hold; allocations on others are refused."""
        self._capacity = dict(capacities)

    def orphans(self) -> list[Allocation]:
        """Allocations on devices this node no longer has (lost, removed): kept, reported."""
        return [
            a
            for a in self._allocations.values()
            if any(uuid not in self._capacity for uuid in a.device_uuids)
        ]

    def check_invariants(self) -> None:
        """Raise LedgerError if any known device holds more than its capacity."""
        for uuid, capacity in self._capacity.items():
            if self.vram_used(uuid) > capacity.vram_bytes:
                raise LedgerError(f"device {uuid} holds more VRAM than it has")
            if self.compute_used(uuid) > capacity.compute_percent:
                raise LedgerError(f"device {uuid} holds more than 100% compute")

    # -- operations -------------------------------------------------------------------------

    def allocate(self, allocation: Allocation) -> tuple[Allocation, bool]:
        """Record an allocation durably; returns (the allocation held, whether it is new).

        Repeating the same allocation for a container returns the one already held without a
        write; a different one for the same container is a conflict.
        """
        existing = self._allocations.get(allocation.container_id)
        if existing is not None:
            if existing.grants == allocation.grants:
                return existing, False
            raise LedgerConflict(
                f"container {allocation.container_id} already holds "
                f"{_describe(existing)}; release it first"
            )
        check_capacity(allocation, self._capacity, self.vram_used, self.compute_used)
        self._write({"op": _ALLOCATE, "a": codec.encode_allocation(allocation)})
        return allocation, True

    def release(self, container_id: str) -> Allocation | None:
        """Release a container's allocation durably; None (and no write) if it holds none."""
        existing = self._allocations.get(container_id)
        if existing is None:
            return None
        self._write({"op": _RELEASE, "c": container_id})
        return existing

    def accept(self, acceptance: Acceptance) -> None:
        """Remember durably that this pod's assignment (by digest) was accepted; no write
        when the same digest is already recorded."""
        existing = self._accepted.get(acceptance.pod_uid)
        if existing is not None and existing.digest == acceptance.digest:
            return
        self._write({"op": _ACCEPT, "p": codec.encode_acceptance(acceptance)})

    def forget(self, pod_uid: str) -> None:
        """Drop a pod's acceptance durably (the pod is gone); no write if there is none."""
        if pod_uid in self._accepted:
            self._write({"op": _FORGET, "u": pod_uid})

    def _write(self, operation: dict[str, Any]) -> None:
        """Append one operation durably (fsync'd) with the next sequence number, then apply it."""
        record = {"s": self._seq + 1, **operation}
        self._append(record)
        self._apply(record)
        self._seq += 1
        self._maybe_compact()

    def compact(self) -> None:
        """Snapshot the state and start an empty journal."""
        self._check_writable()
        state = {
            "s": self._seq,
            "allocations": [codec.encode_allocation(a) for a in self.allocations()],
            "accepted": [codec.encode_acceptance(a) for a in self.acceptances()],
        }
        try:
            write_atomic(self.fs, self._snapshot_path, snapshot_bytes(codec.encode(state)))
        except OSError as e:
            # Nothing changed: the journal is still whole and authoritative.
            raise LedgerWriteError(f"failed to write the ledger snapshot: {e}") from e
        failure: OSError | None = None
        try:
            write_atomic(self.fs, self._journal_path, JOURNAL_HEADER)
        except OSError as e:
            failure = e
        # Whether or not the rename happened, the file at the path is the one to append to:
        # the old journal (replace failed) or the new empty one (the snapshot covers it).
        self.fs.close(self._fd)
        try:
            self._fd = self.fs.open_append(self._journal_path)
            self._end = self.fs.size(self._fd)
        except OSError as e:
            self._fd = -1
            self._broken = f"cannot reopen the journal: {e}"
            raise LedgerWriteError(f"failed to reopen the ledger journal: {e}") from e
        self._records_since_snapshot = 0
        if failure is not None:
            raise LedgerWriteError(f"failed to start a new journal: {failure}") from failure

    # -- internals --------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise LedgerWriteError(
                f"ledger refuses writes after an unrecoverable write error ({self._broken}); "
                "restart hcsd to recover from the journal"
            )
        if self._fd < 0:
            raise LedgerError("ledger is not open")

    def _append(self, record: dict[str, Any]) -> None:
        self._check_writable()
        data = frame(codec.encode(record))
        try:
            self.fs.write(self._fd, data)
            self.fs.sync(self._fd)
        except OSError as e:
            self._roll_back(e)
            raise LedgerWriteError(f"failed to write the ledger journal: {e}") from e
        self._end += len(data)
        self._records_since_snapshot += 1

    def _roll_back(self, error: OSError) -> None:
        """Cut a partial record off so that the next append starts on a record boundary."""
        try:
            self.fs.truncate(self._fd, self._end)
            self.fs.sync(self._fd)
        except OSError as e:
            # The tail may hold a partial record; replay would drop it as torn, but appending
            # after it would bury it mid-file. Stop writing until a restart replays cleanly.
            self._broken = f"{error}; roll-back failed: {e}"
            log.error("ledger: %s", self._broken)

    def _maybe_compact(self) -> None:
        if self._records_since_snapshot < self.compact_after:
            return
        try:
            self.compact()
        except LedgerWriteError as e:
            log.warning("ledger: %s; will retry after the next operation", e)

    def _apply(self, record: Mapping[str, Any]) -> None:
        op = record["op"]
        if op == _ALLOCATE:
            self._insert(codec.decode_allocation(record["a"]))
        elif op == _RELEASE:
            self._remove(str(record["c"]))
        elif op == _ACCEPT:
            self._accept(codec.decode_acceptance(record["p"]))
        elif op == _FORGET:
            self._accepted.pop(str(record["u"]), None)
        else:
            raise ValueError(f"unknown operation {op!r}")

    def _accept(self, acceptance: Acceptance) -> None:
        self._accepted[acceptance.pod_uid] = acceptance

    def _insert(self, allocation: Allocation) -> None:
        self._remove(allocation.container_id)
        self._allocations[allocation.container_id] = allocation
        for grant in allocation.grants:
            uuid = grant.device_uuid
            self._vram_used[uuid] = self._vram_used.get(uuid, 0) + grant.vram_bytes
            self._compute_used[uuid] = self._compute_used.get(uuid, 0) + grant.compute_percent

    def _remove(self, container_id: str) -> None:
        allocation = self._allocations.pop(container_id, None)
        if allocation is None:
            return
        for grant in allocation.grants:
            uuid = grant.device_uuid
            self._vram_used[uuid] -= grant.vram_bytes
            self._compute_used[uuid] -= grant.compute_percent
            if not self._vram_used[uuid] and not self._compute_used[uuid]:
                del self._vram_used[uuid], self._compute_used[uuid]


def _describe(allocation: Allocation) -> str:
    return ", ".join(f"{format_bytes(g.vram_bytes)} on {g.device_uuid}" for g in allocation.grants)
