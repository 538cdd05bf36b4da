"""Record framing for the journal and the snapshot: a length and a CRC-32 per record.

Journal file: an 8-byte file header (`HCSJ`, format version u32), then records of
`u32 length | u32 crc32(payload) | payload`, little-endian. A record whose bytes run past the end
of the file, or the last record when its checksum fails, is a torn write from a crash and is
dropped; a bad record followed by more data is corruption and is reported, never skipped.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from hcsd.ledger.errors import LedgerCorrupt

__all__ = ["JOURNAL_HEADER", "SNAPSHOT_MAGIC", "Scan", "frame", "scan_journal", "unframe_one"]

JOURNAL_MAGIC = b"HCSJ"
SNAPSHOT_MAGIC = b"HCSS"
FORMAT_VERSION = 1
JOURNAL_HEADER = JOURNAL_MAGIC + struct.pack("<I", FORMAT_VERSION)
_RECORD = struct.Struct("<II")
MAX_RECORD = 16 * 1024 * 1024  # no single operation comes near this; larger is corruption


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_RECORD:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_RECORD}-byte limit")
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True, slots=True)
class Scan:
    """What a journal holds: the intact payloads and where the intact part ends."""

    payloads: list[bytes]
    valid_end: int
    torn_bytes: int  # bytes after valid_end that a crash left behind


def scan_journal(data: bytes, path: str) -> Scan:
    if not data:
        return Scan([], 0, 0)
    header = len(JOURNAL_HEADER)
    if len(data) < header:
        # A crash while the header itself was being written: nothing was ever acknowledged.
        if JOURNAL_HEADER.startswith(data):
            return Scan([], 0, len(data))
        raise LedgerCorrupt(f"{path}: not an HCS journal (bad header)")
    if data[:4] != JOURNAL_MAGIC:
        raise LedgerCorrupt(f"{path}: not an HCS journal (bad magic {data[:4]!r})")
    (version,) = struct.unpack_from("<I", data, 4)
    if version != FORMAT_VERSION:
        raise LedgerCorrupt(f"{path}: journal format {version} is not supported")
    payloads: list[bytes] = []
    offset = header
    end = len(data)
    view = memoryview(data)
    while offset < end:
        if end - offset < _RECORD.size:
            return Scan(payloads, offset, end - offset)
        length, checksum = _RECORD.unpack_from(data, offset)
        start = offset + _RECORD.size
        stop = start + length
        if length > MAX_RECORD or stop > end:
            # The length field points past what was written: only a torn tail can do that
            # (or a corrupted length, which we cannot tell apart from one at the very end).
            if length > MAX_RECORD and stop < end:
                raise LedgerCorrupt(f"{path}: record at offset {offset} has length {length}")
            return Scan(payloads, offset, end - offset)
        payload = bytes(view[start:stop])
        if zlib.crc32(payload) != checksum:
            if stop == end:
                return Scan(payloads, offset, end - offset)
            raise LedgerCorrupt(
                f"{path}: record at offset {offset} fails its checksum and is followed by "
                f"{end - stop} more bytes; refusing to guess (inspect or restore the file)"
            )
        payloads.append(payload)
        offset = stop
    return Scan(payloads, offset, 0)


def unframe_one(data: bytes, magic: bytes, path: str) -> bytes:
    """Check a whole-file record (the snapshot): magic, version, length and checksum."""
    prefix = len(magic) + 4
    if len(data) < prefix + _RECORD.size or data[: len(magic)] != magic:
        raise LedgerCorrupt(f"{path}: not an HCS snapshot")
    (version,) = struct.unpack_from("<I", data, len(magic))
    if version != FORMAT_VERSION:
        raise LedgerCorrupt(f"{path}: snapshot format {version} is not supported")
    length, checksum = _RECORD.unpack_from(data, prefix)
    payload = data[prefix + _RECORD.size :]
    if len(payload) != length or zlib.crc32(payload) != checksum:
        raise LedgerCorrupt(f"{path}: snapshot fails its length or checksum")
    return payload


def snapshot_bytes(payload: bytes) -> bytes:
    return SNAPSHOT_MAGIC + struct.pack("<I", FORMAT_VERSION) + frame(payload)
