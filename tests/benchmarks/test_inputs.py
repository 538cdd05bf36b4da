"""The GEMM's inputs: random finite halves below 1 in magnitude, tiled over the whole matrix."""

from __future__ import annotations

import math
import struct

import pytest

from hcsd.benchmarks.inputs import fill_random, random_halves


def test_random_halves_are_finite_below_one_and_varied() -> None:
    data = random_halves(1 << 16)
    values = struct.unpack(f"<{len(data) // 2}e", data)
    assert all(math.isfinite(v) and 2**-7 <= abs(v) < 1 for v in values)
    assert len(set(values)) > 1000 and any(v < 0 for v in values) and any(v > 0 for v in values)


class Memory:
    """Device memory as a bytearray: what the vendor kernels' upload and tile do."""

    def __init__(self, size: int) -> None:
        self.bytes = bytearray(size)
        self.calls: list[str] = []

    def upload(self, pointer: int, data: bytes) -> None:
        self.bytes[pointer : pointer + len(data)] = data
        self.calls.append(f"upload {pointer} {len(data)}")

    def tile(self, target: int, source: int, size: int) -> None:
        assert target >= source + size or target + size <= source  # no overlap
        self.bytes[target : target + size] = self.bytes[source : source + size]
        self.calls.append(f"tile {target} {source} {size}")


@pytest.mark.parametrize(
    ("size", "chunk", "copies"),
    [
        pytest.param(64, 64, 0, id="one-chunk"),
        pytest.param(32, 64, 0, id="smaller-than-a-chunk"),
        pytest.param(1024, 16, 6, id="doubling"),
        pytest.param(1000, 16, 6, id="ragged-end"),
    ],
)
def test_fill_covers_the_matrix_by_doubling(size: int, chunk: int, copies: int) -> None:
    memory = Memory(size + 8)
    fill_random(memory, 4, size, chunk)
    first = memory.bytes[4 : 4 + min(chunk, size)]
    assert memory.calls[0] == f"upload 4 {len(first)}"
    assert len(memory.calls) == 1 + copies
    filled = memory.bytes[4 : 4 + size]
    assert all(filled[i] == first[i % len(first)] for i in range(size))
    assert memory.bytes[:4] == bytes(4) and memory.bytes[4 + size :] == bytes(4)
