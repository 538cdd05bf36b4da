"""The measurement loop over a simulated device with a controlled clock: a timed warm-up, a
sizing call, then the timed calls."""

from __future__ import annotations

import pytest

from hcsd.benchmarks.timing import time_kernel


class SimulatedDevice:
    """GEMMs of `seconds` each (the first `slow_first` ones twice as long, as a card whose
    clocks are still ramping), queued until `sync`, which moves the clock on."""

    m = n = k = 1000
    copy_bytes = 0

    def __init__(self, seconds: float, slow_first: int = 0) -> None:
        self.seconds = seconds
        self.slow_first = slow_first
        self.now = 0.0
        self.queued = 0.0
        self.gemms = 0

    def clock(self) -> float:
        return self.now

    def gemm(self) -> None:
        self.gemms += 1
        self.queued += self.seconds * (2 if self.gemms <= self.slow_first else 1)

    def copy(self) -> None:
        raise AssertionError("no copy offered")

    def sync(self) -> None:
        self.now += self.queued
        self.queued = 0.0


def test_the_warm_up_lasts_its_time_so_ramping_clocks_are_not_timed() -> None:
    device = SimulatedDevice(2**-7, slow_first=20)  # 20 slow calls: 0.3125 s of ramping
    figures = time_kernel(device, 3.0, warmup=0.5, clock=device.clock)
    # warm-up: calls until 0.5 s passed (20 slow + 24 fast), one to size, then 3 s of calls
    assert figures.iterations == 384
    assert figures.seconds == pytest.approx(3.0)
    assert figures.tflops == pytest.approx(2 * 1000**3 * 128 / 1e12)  # none of the slow ones
    assert device.gemms == 44 + 1 + 384


def test_a_slow_card_warms_up_with_one_call() -> None:
    device = SimulatedDevice(2.0)
    figures = time_kernel(device, 1.0, warmup=0.5, clock=device.clock)
    assert device.gemms == 1 + 1 + figures.iterations and figures.iterations == 3  # the minimum
