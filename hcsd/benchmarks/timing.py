"""The vendor-neutral measurement loop: warm up, size the run from one timed GEMM, time the
GEMMs, then (if the vendor offers it) a device-to-device copy.

The warm-up lasts `warmup` seconds of GEMMs (at least one: the library picks its kernel on the
first call), so clocks and power have ramped before anything is timed. The figure is the
sustained rate over `duration` seconds right after that: a few seconds, not a long soak, so a
card that slows down only after minutes at its thermal or power limit is not caught by it.

Every timed span ends with the device synchronised, so what is timed is the device's work and
not the launches. The run fills `duration` seconds (at least 3 GEMMs, at most 100,000), so a
slow card is not measured for minutes and a fast one not on a handful of calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Figures", "Kernel", "time_kernel"]

MIN_ITERATIONS = 3
MAX_ITERATIONS = 100_000


class Kernel(Protocol):
    """One device, set up: its buffers allocated and its math library's handle made."""

    m: int
    n: int
    k: int
    copy_bytes: int  # 0: no device-to-device copy offered

    def gemm(self) -> None:
        """Queue one C = A·B (FP16)."""

    def copy(self) -> None:
        """Queue one copy of `copy_bytes` from one device buffer to another."""

    def sync(self) -> None:
        """Wait until the device has finished everything queued."""


@dataclass(frozen=True, slots=True)
class Figures:
    tflops: float
    seconds: float  # of timed GEMMs
    iterations: int
    bandwidth_gbps: float | None  # read + write bytes per second of the copy, in 1e9


def time_kernel(
    kernel: Kernel,
    duration: float,
    *,
    warmup: float = 0.5,
    bandwidth: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Figures:
    started = clock()
    while True:  # warm-up: the library picks its kernel, the clocks ramp
        kernel.gemm()
        kernel.sync()
        if clock() - started >= warmup:
            break
    start = clock()
    kernel.gemm()
    kernel.sync()
    one = max(clock() - start, 1e-9)
    iterations = min(max(int(duration / one), MIN_ITERATIONS), MAX_ITERATIONS)
    start = clock()
    for _ in range(iterations):
        kernel.gemm()
    kernel.sync()
    seconds = max(clock() - start, 1e-9)
    flops = 2.0 * kernel.m * kernel.n * kernel.k * iterations
    gbps = _bandwidth(kernel, duration / 4, clock) if bandwidth and kernel.copy_bytes else None
    return Figures(flops / seconds / 1e12, seconds, iterations, gbps)


def _bandwidth(kernel: Kernel, duration: float, clock: Callable[[], float]) -> float:
    kernel.copy()
    kernel.sync()
    start = clock()
    kernel.copy()
    kernel.sync()
    one = max(clock() - start, 1e-9)
    copies = min(max(int(duration / one), MIN_ITERATIONS), MAX_ITERATIONS)
    start = clock()
    for _ in range(copies):
        kernel.copy()
    kernel.sync()
    seconds = max(clock() - start, 1e-9)
    return 2.0 * kernel.copy_bytes * copies / seconds / 1e9
