from __future__ import annotations

import errno
import os
import struct
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from hcsd.ledger import (
    FileSystem,
    Ledger,
    LedgerConflict,
    LedgerCorrupt,
    LedgerLocked,
    LedgerWriteError,
    OverCapacity,
)
from hcsd.ledger.framing import JOURNAL_HEADER, frame, snapshot_bytes
from hcsd.ledger.ledger import Capacity, LedgerSection
from hcsd.model import Acceptance, Allocation, FrontEnd, Grant, PodRef
from tests.conftest import GiB

CAPACITY = {"g0": Capacity(80 * GiB), "g1": Capacity(80 * GiB)}


def alloc(cid: str, *grants: tuple[str, int], compute: int = 0) -> Allocation:
    return Allocation(
        container_id=cid,
        grants=tuple(Grant(uuid, gib * GiB, compute) for uuid, gib in grants),
        pod=PodRef("ns", f"pod-{cid}", f"uid-{cid}"),
        container_name="main",
        created=1700000000.5,
    )


def open_ledger(path: Path, fs: FileSystem | None = None, compact_after: int = 10_000) -> Ledger:
    ledger = Ledger(str(path), LedgerSection(compact_after=compact_after), fs=fs)
    ledger.open()
    ledger.set_capacities(CAPACITY)
    return ledger


def state(ledger: Ledger) -> dict[str, Allocation]:
    return {a.container_id: a for a in ledger.allocations()}


def test_replay_restores_allocations_exactly(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g0", 10)))
    ledger.allocate(alloc("b", ("g0", 20), ("g1", 20), compute=50))
    ledger.release("a")
    before = state(ledger)
    ledger.close()
    again = open_ledger(tmp_path)
    assert state(again) == before
    assert again.vram_used("g0") == 20 * GiB
    assert again.compute_used("g1") == 50
    assert again.seq == 3


def test_over_capacity_is_refused_with_figures(ledger: Ledger) -> None:
    ledger.set_capacities(CAPACITY)
    ledger.allocate(alloc("a", ("g0", 70)))
    with pytest.raises(OverCapacity, match="device g0: 20Gi of VRAM requested, 10Gi free of 80Gi"):
        ledger.allocate(alloc("b", ("g0", 20)))
    assert ledger.vram_used("g0") == 70 * GiB


def test_compute_share_cannot_pass_100(ledger: Ledger) -> None:
    ledger.set_capacities(CAPACITY)
    ledger.allocate(alloc("a", ("g0", 1), compute=70))
    with pytest.raises(OverCapacity, match="40% compute requested, 30% free"):
        ledger.allocate(alloc("b", ("g0", 1), compute=40))


@pytest.mark.parametrize(
    ("allocation", "message"),
    [
        pytest.param(alloc("x", ("nope", 1)), "not on this node", id="unknown-device"),
        pytest.param(alloc("x", ("g0", 1), ("g0", 1)), "appears twice", id="same-device-twice"),
        pytest.param(Allocation("x", ()), "needs grants", id="no-grants"),
        pytest.param(Allocation("x", (Grant("g0", 0),)), "positive VRAM", id="zero-vram"),
    ],
)
def test_malformed_allocations_are_refused(
    ledger: Ledger, allocation: Allocation, message: str
) -> None:
    ledger.set_capacities(CAPACITY)
    with pytest.raises(OverCapacity, match=message):
        ledger.allocate(allocation)
    assert ledger.seq == 0


def test_allocate_is_idempotent_by_container_id(ledger: Ledger) -> None:
    ledger.set_capacities(CAPACITY)
    first, created = ledger.allocate(alloc("a", ("g0", 10)))
    again, created_again = ledger.allocate(alloc("a", ("g0", 10)))
    assert created and not created_again and again == first
    assert ledger.seq == 1 and ledger.vram_used("g0") == 10 * GiB
    with pytest.raises(LedgerConflict, match="already holds 10Gi on g0"):
        ledger.allocate(alloc("a", ("g1", 10)))


def test_release_unknown_is_a_no_op(ledger: Ledger) -> None:
    assert ledger.release("ghost") is None
    assert ledger.seq == 0


def test_torn_tail_is_dropped_and_appending_continues(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g0", 10)))
    ledger.allocate(alloc("b", ("g0", 10)))
    ledger.close()
    journal = tmp_path / "journal"
    data = journal.read_bytes()
    journal.write_bytes(data[:-5])  # the last record lost its end in a crash
    again = open_ledger(tmp_path)
    assert set(state(again)) == {"a"}
    assert again.report.torn_bytes > 0
    again.allocate(alloc("c", ("g1", 10)))
    again.close()
    assert set(state(open_ledger(tmp_path))) == {"a", "c"}


def test_torn_record_header_is_dropped(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g0", 10)))
    ledger.close()
    with open(tmp_path / "journal", "ab") as f:
        f.write(b"\x10\x00")  # two bytes of the next length field
    assert set(state(open_ledger(tmp_path))) == {"a"}


def test_corruption_mid_journal_is_reported_not_skipped(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    for cid in "abc":
        ledger.allocate(alloc(cid, ("g0", 1)))
    ledger.close()
    journal = tmp_path / "journal"
    data = bytearray(journal.read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload
    journal.write_bytes(bytes(data))
    before = bytes(data)
    with pytest.raises(LedgerCorrupt, match=r"offset 8 fails its checksum and is followed by"):
        open_ledger(tmp_path)
    assert journal.read_bytes() == before  # nothing was "repaired" away


def five_records(tmp_path: Path) -> tuple[bytes, list[tuple[int, int]]]:
    """A journal of five acknowledged allocations and (offset, length) of each record."""
    ledger = open_ledger(tmp_path)
    for cid in "abcde":
        ledger.allocate(alloc(cid, ("g0", 1)))
    ledger.close()
    data = (tmp_path / "journal").read_bytes()
    records, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        records.append((offset, length))
        offset += 8 + length
    assert len(records) == 5
    return data, records


def damage(data: bytes, offset: int, field: str) -> bytes:
    """One field of the record at `offset` damaged: `length=<value>`, `length^<bit>`, …"""
    out = bytearray(data)
    (length,) = struct.unpack_from("<I", out, offset)
    if field.startswith("length="):
        struct.pack_into("<I", out, offset, int(field[7:], 0))
    elif field.startswith("length^"):
        struct.pack_into("<I", out, offset, length ^ (1 << int(field[7:])))
    elif field == "checksum":
        out[offset + 4] ^= 0x01
    elif field == "payload":
        out[offset + 8 + length // 2] ^= 0x40
    else:
        raise AssertionError(field)
    return bytes(out)


LENGTH_DAMAGE = ["length=0x7FFFFFFF", "length=0", *(f"length^{bit}" for bit in range(32))]


@pytest.mark.parametrize("field", [*LENGTH_DAMAGE, "checksum", "payload"])
def test_any_damage_to_a_middle_record_is_corruption(tmp_path: Path, field: str) -> None:
    """Records after it were acknowledged: nothing may be dropped or truncated."""
    data, records = five_records(tmp_path)
    broken = damage(data, records[2][0], field)
    (tmp_path / "journal").write_bytes(broken)
    with pytest.raises(LedgerCorrupt, match=f"record at offset {records[2][0]} "):
        open_ledger(tmp_path)
    assert (tmp_path / "journal").read_bytes() == broken


@pytest.mark.parametrize("field", LENGTH_DAMAGE)
def test_a_damaged_length_of_the_last_record_is_corruption(tmp_path: Path, field: str) -> None:
    """The whole record is there: a crash cannot produce that with a wrong length."""
    data, records = five_records(tmp_path)
    broken = damage(data, records[4][0], field)
    (tmp_path / "journal").write_bytes(broken)
    with pytest.raises(LedgerCorrupt, match=f"record at offset {records[4][0]} "):
        open_ledger(tmp_path)
    assert (tmp_path / "journal").read_bytes() == broken


@pytest.mark.parametrize("field", ["checksum", "payload"])
def test_a_last_record_failing_its_checksum_at_the_end_is_torn(tmp_path: Path, field: str) -> None:
    """What a crash leaves when the file grew before the record's data reached the disk."""
    data, records = five_records(tmp_path)
    (tmp_path / "journal").write_bytes(damage(data, records[4][0], field))
    again = open_ledger(tmp_path)
    assert set(state(again)) == set("abcd")
    assert again.report.torn_bytes == 8 + records[4][1]
    again.close()
    assert (tmp_path / "journal").read_bytes() == data[: records[4][0]]


def test_every_cut_of_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    data, records = five_records(tmp_path)
    last = records[4][0]
    for cut in range(last + 1, len(data)):
        (tmp_path / "journal").write_bytes(data[:cut])
        again = open_ledger(tmp_path)
        assert set(state(again)) == set("abcd"), cut
        assert again.report.torn_bytes == cut - last
        again.close()


def test_a_last_record_whose_data_never_reached_the_disk_is_torn(tmp_path: Path) -> None:
    """The file's size was made durable, its new bytes were not: they read as zeros."""
    data, records = five_records(tmp_path)
    last, length = records[4]
    for written in (0, 1, 3, 4, 8, 8 + length // 2):
        zeroed = data[: last + written] + bytes(len(data) - last - written)
        (tmp_path / "journal").write_bytes(zeroed)
        again = open_ledger(tmp_path)
        assert set(state(again)) == set("abcd"), written
        again.close()


def test_corrupt_snapshot_is_reported(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g0", 1)))
    ledger.compact()
    ledger.close()
    snapshot = tmp_path / "snapshot"
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0x01
    snapshot.write_bytes(bytes(data))
    with pytest.raises(LedgerCorrupt, match="snapshot fails its length or checksum"):
        open_ledger(tmp_path)


def test_not_a_journal_is_reported(tmp_path: Path) -> None:
    tmp_path.joinpath("journal").write_bytes(b"hello world, not a journal")
    with pytest.raises(LedgerCorrupt, match="not an HCS journal"):
        open_ledger(tmp_path)


def test_compaction_keeps_state_and_shrinks_the_journal(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path, compact_after=10)
    for i in range(25):
        ledger.allocate(alloc(f"c{i}", ("g0", 1)))
        if i % 2:
            ledger.release(f"c{i}")
    expected = state(ledger)
    seq = ledger.seq
    ledger.close()
    assert (tmp_path / "journal").stat().st_size < 2_000
    again = open_ledger(tmp_path)
    assert state(again) == expected and again.seq == seq


def test_crash_between_snapshot_and_new_journal_replays_once(tmp_path: Path) -> None:
    """Snapshot written, old journal still in place: its records must not apply twice."""
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g0", 10)))
    ledger.allocate(alloc("b", ("g0", 10)))
    ledger.release("a")
    old_journal = (tmp_path / "journal").read_bytes()
    ledger.compact()
    ledger.close()
    (tmp_path / "journal").write_bytes(old_journal)
    again = open_ledger(tmp_path)
    assert set(state(again)) == {"b"}
    assert again.vram_used("g0") == 10 * GiB
    assert again.seq == 3


class FailingFs(FileSystem):
    """Fails chosen calls with a chosen errno, after letting some bytes through."""

    def __init__(self) -> None:
        self.fail_write: int | None = None
        self.fail_sync: int | None = None
        self.fail_truncate: int | None = None
        self.partial = 7

    def write(self, fd: int, data: bytes) -> None:
        if self.fail_write is not None:
            os.write(fd, data[: self.partial])  # a short write, then the disk is full
            raise OSError(self.fail_write, os.strerror(self.fail_write))
        super().write(fd, data)

    def sync(self, fd: int) -> None:
        if self.fail_sync is not None:
            raise OSError(self.fail_sync, os.strerror(self.fail_sync))
        super().sync(fd)

    def truncate(self, fd: int, size: int) -> None:
        if self.fail_truncate is not None:
            raise OSError(self.fail_truncate, os.strerror(self.fail_truncate))
        super().truncate(fd, size)


def test_disk_full_refuses_cleanly_and_loses_nothing(tmp_path: Path) -> None:
    fs = FailingFs()
    ledger = open_ledger(tmp_path, fs=fs)
    ledger.allocate(alloc("a", ("g0", 10)))
    fs.fail_write = errno.ENOSPC
    with pytest.raises(LedgerWriteError, match="No space left on device"):
        ledger.allocate(alloc("b", ("g0", 10)))
    assert set(state(ledger)) == {"a"} and ledger.seq == 1
    fs.fail_write = None  # space freed: the same request now succeeds
    ledger.allocate(alloc("b", ("g0", 10)))
    ledger.close()
    assert set(state(open_ledger(tmp_path))) == {"a", "b"}


def test_failed_fsync_is_not_acknowledged(tmp_path: Path) -> None:
    fs = FailingFs()
    ledger = open_ledger(tmp_path, fs=fs)
    fs.fail_sync = errno.EIO
    with pytest.raises(LedgerWriteError):
        ledger.allocate(alloc("a", ("g0", 10)))
    assert ledger.get("a") is None
    fs.fail_sync = None
    ledger.close()
    assert state(open_ledger(tmp_path)) == {}


def test_failed_roll_back_stops_writes_until_restart(tmp_path: Path) -> None:
    fs = FailingFs()
    ledger = open_ledger(tmp_path, fs=fs)
    ledger.allocate(alloc("a", ("g0", 10)))
    fs.fail_write = errno.ENOSPC
    fs.fail_truncate = errno.EIO
    with pytest.raises(LedgerWriteError):
        ledger.allocate(alloc("b", ("g0", 10)))
    fs.fail_write = fs.fail_truncate = None
    with pytest.raises(LedgerWriteError, match="restart hcsd"):
        ledger.allocate(alloc("c", ("g0", 10)))
    ledger.close()
    again = open_ledger(tmp_path)  # the partial record is a torn tail: dropped
    assert set(state(again)) == {"a"}
    assert again.report.torn_bytes == fs.partial


def test_failed_compaction_keeps_the_journal(tmp_path: Path) -> None:
    class SnapshotFails(FileSystem):
        def replace(self, source: str, target: str, dir_fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    ledger = open_ledger(tmp_path, fs=SnapshotFails(), compact_after=3)
    for i in range(5):
        ledger.allocate(alloc(f"c{i}", ("g0", 1)))  # compaction fails, operations succeed
    ledger.close()
    assert len(state(open_ledger(tmp_path))) == 5


def test_second_owner_is_locked_out(tmp_path: Path) -> None:
    open_ledger(tmp_path)
    with pytest.raises(LedgerLocked, match="in use by another process"):
        open_ledger(tmp_path)


def test_orphans_are_kept_and_reported(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(alloc("a", ("g1", 10)))
    ledger.set_capacities({"g0": CAPACITY["g0"]})  # g1 is gone
    assert [a.container_id for a in ledger.orphans()] == ["a"]
    ledger.check_invariants()


# A record as builds before the front end was kept wrote it: no "f" key.
OLD_RECORD = {
    "c": "old",
    "g": [["g0", 2 * GiB, 0]],
    "p": ["ns", "pod-old", "uid-old"],
    "n": "main",
    "t": 1700000000.5,
    "o": "local",
}


def test_an_old_journal_record_reads_as_an_unknown_front_end(tmp_path: Path) -> None:
    record = {"s": 1, "op": "a", "a": OLD_RECORD}
    (tmp_path / "journal").write_bytes(JOURNAL_HEADER + frame(msgpack.packb(record)))
    ledger = open_ledger(tmp_path)
    held = ledger.get("old")
    assert held is not None and held.front_end is FrontEnd.UNKNOWN
    assert held.grants == (Grant("g0", 2 * GiB),) and held.source == "local"


def test_an_old_snapshot_reads_as_an_unknown_front_end(tmp_path: Path) -> None:
    state = {"s": 7, "allocations": [OLD_RECORD]}
    (tmp_path / "snapshot").write_bytes(snapshot_bytes(msgpack.packb(state)))
    ledger = open_ledger(tmp_path)
    held = ledger.get("old")
    assert held is not None and held.front_end is FrontEnd.UNKNOWN and ledger.seq == 7


def test_the_front_end_survives_replay_and_compaction(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path)
    ledger.allocate(replace(alloc("h", ("g0", 1)), front_end=FrontEnd.OCI_HOOK))
    ledger.allocate(replace(alloc("w", ("g1", 1)), front_end=FrontEnd.RUNC_WRAPPER))
    ledger.close()
    again = open_ledger(tmp_path)
    assert {a.container_id: a.front_end for a in again.allocations()} == {
        "h": FrontEnd.OCI_HOOK,
        "w": FrontEnd.RUNC_WRAPPER,
    }
    again.compact()
    again.close()
    third = open_ledger(tmp_path)
    assert state(third)["w"].front_end is FrontEnd.RUNC_WRAPPER


def test_a_front_end_this_build_does_not_know_is_corruption(tmp_path: Path) -> None:
    record = {"s": 1, "op": "a", "a": {**OLD_RECORD, "f": "from-the-future"}}
    (tmp_path / "journal").write_bytes(JOURNAL_HEADER + frame(msgpack.packb(record)))
    with pytest.raises(LedgerCorrupt, match="record #0 cannot be decoded"):
        open_ledger(tmp_path)


@pytest.mark.parametrize("compact", [False, True], ids=["journal", "snapshot"])
def test_acceptances_survive_a_restart_and_forgetting_is_durable(
    tmp_path: Path, compact: bool
) -> None:
    ledger = open_ledger(tmp_path)
    ledger.accept(Acceptance("uid-1", "d" * 64, 1700000000.0))
    ledger.accept(Acceptance("uid-2", "e" * 64, 1700000001.0))
    seq = ledger.seq
    ledger.accept(Acceptance("uid-1", "d" * 64, 1700000099.0))  # the same text: no write
    assert ledger.seq == seq
    ledger.forget("uid-2")
    ledger.forget("uid-2")  # nothing left to forget: no write
    assert ledger.seq == seq + 1
    if compact:
        ledger.compact()
    ledger.close()
    again = open_ledger(tmp_path)
    assert again.acceptances() == [Acceptance("uid-1", "d" * 64, 1700000000.0)]
    assert again.acceptance("uid-2") is None


def test_a_snapshot_without_acceptances_still_loads(tmp_path: Path) -> None:
    """Snapshots written before acceptances were recorded have no "accepted" list."""
    payload = msgpack.packb({"s": 1, "allocations": []}, use_bin_type=True)
    (tmp_path / "snapshot").write_bytes(snapshot_bytes(payload))
    assert open_ledger(tmp_path).acceptances() == []
