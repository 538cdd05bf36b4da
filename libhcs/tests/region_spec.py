"""Write a usage region from its specification in include/hcs_abi.h, as hcsd does in Python.

    python3 region_spec.py PATH [VARIANT]

VARIANT (default `valid`) damages one thing, for the tests that libhcs refuses it: `magic`,
`checksum` (a header field changed, the CRC left as it was), `version` (version 2 with a
correct CRC), `size` (one byte short), `lock` (an impossible lock state).
"""

from __future__ import annotations

import struct
import sys
import zlib

REGION_SIZE = 35328
MAGIC = 0x4843535245474E31


def header(version: int = 3) -> bytes:
    """The 32 header bytes: magic, version, devices, processes, slot size, size, CRC-32."""
    fields = struct.pack("<QIIIII", MAGIC, version, 16, 256, 136, REGION_SIZE)
    return fields + struct.pack("<I", zlib.crc32(fields))


def region(variant: str = "valid") -> bytes:
    """An initialised empty region, damaged as `variant` says."""
    data = bytearray(header(2 if variant == "version" else 3) + bytes(REGION_SIZE - 32))
    if variant == "magic":
        data[0:8] = b"HCSUSAGE"
    elif variant == "checksum":
        data[16] = 1  # 257 processes
    elif variant == "size":
        del data[-1]
    elif variant == "lock":
        data[160:164] = struct.pack("<i", -7)
    elif variant not in ("valid", "version"):
        raise SystemExit(f"unknown variant {variant}")
    return bytes(data)


if __name__ == "__main__":
    with open(sys.argv[1], "wb") as out:
        out.write(region(sys.argv[2] if len(sys.argv) > 2 else "valid"))
