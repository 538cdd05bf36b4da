"""Record framing for the journal and the snapshot: a length and a CRC-32 per record.

Journal file: an 8-byte file header (`HCSJ`, format version u32), then records of
`u32 length | u32 crc32(payload) | payload`, little-endian.

A torn tail is only what an interrupted append can leave: the last record's header or payload
cut short at the end of the file, or a last record that ends exactly at the end of the file and
fails its checksum, or one whose bytes after the header are all zeros (the file grew before its
data reached the disk). Those are dropped. Anything else that does not check out is corruption,
reported and never skipped: a length no record can have, a bad record followed by more data, or
a length field that runs to or past the end while the bytes behind it hold a complete record
with that checksum (the length was damaged, and the records after it were acknowledged).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from hcsd.ledger.errors import LedgerCorrupt

__all__ = [
    "JOURNAL_HEADER",
    "SNAPSHOT_MAGIC",
    "PayloadSize",
    "Scan",
    "frame",
    "scan_journal",
    "unframe_one",
]

JOURNAL_MAGIC = b"HCSJ"
SNAPSHOT_MAGIC = b"HCSS"
FORMAT_VERSION = 1
JOURNAL_HEADER = JOURNAL_MAGIC + struct.pack("<I", FORMAT_VERSION)
_RECORD = struct.Struct("<II")
MAX_RECORD = 16 * 1024 * 1024  # no single operation comes near this; larger is corruption

PayloadSize = Callable[[bytes], int | None]
"""Size of the one complete payload that the bytes start with, None when they hold none.

Payloads are self-delimiting (one msgpack object each), which is what tells a damaged length
field from a record cut short: the bytes of a cut record never hold a whole payload.
"""


def frame(payload: bytes) -> bytes:
    if not payload:
        raise ValueError("an empty record cannot be framed (a zeroed header would read as one)")
    if len(payload) > MAX_RECORD:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_RECORD}-byte limit")
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True, slots=True)
class Scan:
    """What a journal holds: the intact payloads and where the intact part ends."""

    payloads: list[bytes]
    valid_end: int
    torn_bytes: int  # bytes after valid_end that a crash left behind


def scan_journal(data: bytes, path: str, payload_size: PayloadSize) -> Scan:
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
            return Scan(payloads, offset, end - offset)  # a record header cut short
        length, checksum = _RECORD.unpack_from(data, offset)
        if length > MAX_RECORD:
            raise LedgerCorrupt(
                f"{path}: record at offset {offset} claims {length} bytes, more than any "
                f"record can hold ({MAX_RECORD}): its length field is damaged; refusing to "
                "guess (inspect or restore the file)"
            )
        start = offset + _RECORD.size
        stop = start + length
        if length > 0 and stop <= end:
            payload = bytes(view[start:stop])
            if zlib.crc32(payload) == checksum:
                payloads.append(payload)
                offset = stop
                continue
        _refuse_unless_torn(view, offset, path, payload_size)
        return Scan(payloads, offset, end - offset)
    return Scan(payloads, offset, 0)


def _refuse_unless_torn(
    data: memoryview, offset: int, path: str, payload_size: PayloadSize
) -> None:
    """Raise LedgerCorrupt unless the record at `offset` is what an interrupted append leaves."""
    length, checksum = _RECORD.unpack_from(data, offset)
    start = offset + _RECORD.size
    body = bytes(data[start : start + MAX_RECORD])
    whole = payload_size(body)
    if whole is not None and zlib.crc32(body[:whole]) == checksum:
        raise LedgerCorrupt(
            f"{path}: record at offset {offset} has a damaged length field: it says {length} "
            f"bytes, but a complete {whole}-byte record with its checksum is there, followed "
            f"by {len(data) - start - whole} more bytes; refusing to guess (inspect or "
            "restore the file)"
        )
    rest = data[start:]
    if len(rest) <= MAX_RECORD and not bytes(rest).strip(b"\x00"):
        return  # the file grew, the record's data never reached the disk
    stop = start + length
    if stop < len(data):
        raise LedgerCorrupt(
            f"{path}: record at offset {offset} fails its checksum and is followed by "
            f"{len(data) - stop} more bytes; refusing to guess (inspect or restore the file)"
        )


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
