"""`usage.shm`: the container's usage region, which hcsd creates and libhcs maps.

The format is libhcs's (libhcs/include/hcs_abi.h, region version 3): 35,328 bytes, a 32-byte
header written once by its creator, everything after it zero in a new region. libhcs refuses a
region whose header differs from this one in any byte (magic, version, sizes, CRC-32) and never
re-initialises one, because the processes using it may be alive. hcsd writes the empty region
before the container starts, owned by the container's user, so that no container process needs
the right to create files, and a process that finds a damaged region cannot reset the counters
under its neighbours.

hcsd's watchdog reads the per-device totals (`USED_OFFSET`); the rest is libhcs's business.
tests/contract/test_region.py holds this module to libhcs's own `hcs-region` tool.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_DEVICES",
    "MAX_PROCESSES",
    "SIZE",
    "USED_OFFSET",
    "VERSION",
    "empty_region",
    "header",
    "problem",
]

MAGIC = 0x4843535245474E31  # the bytes "1NGERSCH" little-endian: "HCSREGN1"
VERSION = 3
MAX_DEVICES = 16
MAX_PROCESSES = 256
SLOT_SIZE = 136  # i32 pid, u32 reserved, 16 x u64 used
SIZE = 35_328
HEADER_SIZE = 32
USED_OFFSET = 32  # 16 x u64: the container's usage per device ordinal
LOCK_STATE_OFFSET = 160  # i32: 0 not set up, a pid setting it up, -1 ready

_FIELDS = struct.Struct("<QIIIII")


def header() -> bytes:
    """The 32 header bytes every region of this version starts with."""
    fields = _FIELDS.pack(MAGIC, VERSION, MAX_DEVICES, MAX_PROCESSES, SLOT_SIZE, SIZE)
    return fields + struct.pack("<I", zlib.crc32(fields))


def empty_region() -> bytes:
    """An initialised empty region, byte for byte what `hcs-region init` writes."""
    return header() + bytes(SIZE - HEADER_SIZE)


def problem(data: bytes) -> str | None:
    """Why libhcs would refuse a region with these bytes; None when it would use it."""
    if len(data) != SIZE:
        return f"{len(data)} bytes, expected {SIZE}"
    if data[:HEADER_SIZE] != header():
        return "the header is not version 3's"
    (lock_state,) = struct.unpack_from("<i", data, LOCK_STATE_OFFSET)
    if lock_state < -1:
        return f"lock state {lock_state}"
    return None
