"""The GEMM's input matrices: random FP16 data, written once before anything is timed.

A GEMM on zeros is faster and draws less power than one on data (the multipliers' bits never
toggle): it inflates the figure (~15% on an H100) and hides a card capped by its power limit.
So A and B hold random halves of random sign with magnitudes in [2^-7, 1) — finite, and small
enough that an FP16 accumulation of 8192 products cannot overflow. Generating them in Python
for a 128 MiB matrix would take seconds, so one host chunk of `CHUNK` bytes is made (big-integer
masks over random bytes: no per-element loop), copied to the start of the matrix, and the
matrix is tiled by device-to-device copies of what is already there (doubling each time, so a
few dozen copies). Each matrix gets a chunk of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

__all__ = ["CHUNK", "fill_random", "random_halves"]

CHUNK = 4 << 20  # bytes of random halves made on the host per matrix

# IEEE half: sign (bit 15), exponent (bits 14-10), mantissa (bits 9-0). Clearing exponent bits
# 4 and 0 and setting bit 3 leaves exponents 8, 10, 12, 14: magnitudes in [2^-7, 1).
_KEEP = 0xBBFF
_SET = 0x2000


class Writable(Protocol):
    def upload(self, pointer: int, data: bytes) -> None:
        """Copy `data` from the host to device memory at `pointer` (synchronously)."""

    def tile(self, target: int, source: int, size: int) -> None:
        """Copy `size` bytes from device memory to device memory (synchronously)."""


def random_halves(size: int, randbytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """`size` bytes (even) of random finite halves in (-1, 1), little-endian."""
    count = size // 2
    bits = int.from_bytes(randbytes(count * 2), "little")
    keep = int.from_bytes(_KEEP.to_bytes(2, "little") * count, "little")
    set_ = int.from_bytes(_SET.to_bytes(2, "little") * count, "little")
    return ((bits & keep) | set_).to_bytes(count * 2, "little")


def fill_random(kernel: Writable, pointer: int, size: int, chunk: int = CHUNK) -> None:
    """Fill `size` bytes at `pointer` with random halves: one upload, then doubling copies."""
    filled = min(chunk, size)
    kernel.upload(pointer, random_halves(filled))
    while filled < size:
        step = min(filled, size - filled)
        kernel.tile(pointer + filled, pointer, step)
        filled += step
