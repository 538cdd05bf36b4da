"""Sub-health: signals read from their evidence, and the tracker's hold, recovery and no-flap
rules under a controlled clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.discovery.pci import read_function
from hcsd.health import signals
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.signals import Signal
from hcsd.health.subhealth import SubHealth, SubHealthTracker
from hcsd.model import Device, Vendor
from hcsd.profiles.database import default_database
from tests.fakes import Function, make_sysfs

HOLD, RECOVERY = 300.0, 120.0
SLOW = Signal("hw-slowdown", "clock event reasons 0x8")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tracker(clock: Clock) -> SubHealthTracker:
    return SubHealthTracker(HOLD, RECOVERY, clock)


def run(tracker: SubHealthTracker, clock: Clock, seconds: float, seen: list[Signal]) -> None:
    """Checks every 5 s for `seconds`, the same signals each time."""
    for _ in range(int(seconds // 5)):
        clock.now += 5
        tracker.update("gpu", seen)


def test_degraded_after_the_hold_not_before(tracker: SubHealthTracker, clock: Clock) -> None:
    assert not tracker.update("gpu", [SLOW])
    run(tracker, clock, HOLD - 5, [SLOW])
    assert tracker.reasons("gpu") == ()  # 295 s: not yet
    clock.now += 5
    assert tracker.update("gpu", [SLOW])  # 300 s: counts, and that is a change
    assert tracker.held("gpu") == (SLOW,)


def test_a_gap_before_the_hold_starts_it_again(tracker: SubHealthTracker, clock: Clock) -> None:
    tracker.update("gpu", [SLOW])
    run(tracker, clock, HOLD - 10, [SLOW])
    run(tracker, clock, 5, [])  # one clean reading
    run(tracker, clock, HOLD, [SLOW])  # seen first at the start of these 300 s: 295 s held
    assert tracker.reasons("gpu") == ()
    run(tracker, clock, 5, [SLOW])
    assert tracker.reasons("gpu") == ("hw-slowdown",)


def test_clears_after_the_recovery_time_and_does_not_flap(
    tracker: SubHealthTracker, clock: Clock
) -> None:
    tracker.update("gpu", [SLOW])
    run(tracker, clock, HOLD, [SLOW])
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    # comes and goes: every other minute for ten minutes, degraded all along
    for _ in range(5):
        run(tracker, clock, 60, [])
        assert tracker.reasons("gpu") == ("hw-slowdown",)
        run(tracker, clock, 60, [SLOW])
        assert tracker.reasons("gpu") == ("hw-slowdown",)
    run(tracker, clock, RECOVERY - 5, [])
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    clock.now += 5
    assert tracker.update("gpu", [])
    assert tracker.held("gpu") == ()


def test_the_latest_detail_is_kept(tracker: SubHealthTracker, clock: Clock) -> None:
    tracker.update("gpu", [SLOW])
    run(tracker, clock, HOLD, [replace(SLOW, detail="clock event reasons 0x48")])
    assert tracker.held("gpu")[0].detail == "clock event reasons 0x48"


def link(tmp_path: Path, width: int, top: int, speed: str, fastest: str) -> object:
    extra = {"max_link_width": str(top), "max_link_speed": fastest}
    sysfs = make_sysfs(
        tmp_path / "sys",
        [Function("0000:3b:00.0", 0x1D94, 0x6210, width=width, speed=speed, extra=extra)],
    )
    return read_function(sysfs, "0000:3b:00.0")


@pytest.mark.parametrize(
    ("width", "speed", "busy", "reasons"),
    [
        pytest.param(16, "16.0 GT/s PCIe", True, [], id="full-link"),
        pytest.param(8, "16.0 GT/s PCIe", None, ["pcie-link-x8-of-x16"], id="down-trained"),
        pytest.param(16, "2.5 GT/s PCIe", False, [], id="idle-low-speed-is-power-saving"),
        pytest.param(16, "2.5 GT/s PCIe", None, [], id="unknown-load-speed-not-judged"),
        pytest.param(
            4, "8.0 GT/s PCIe", True, ["pcie-link-x4-of-x16", "pcie-speed-8gt-of-16gt"], id="both"
        ),
    ],
)
def test_pcie_link_from_sysfs(
    tmp_path: Path, width: int, speed: str, busy: bool | None, reasons: list[str]
) -> None:
    function = link(tmp_path, width, 16, speed, "16.0 GT/s PCIe")
    assert [s.reason for s in signals.pcie_link(function, busy=busy)] == reasons  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gauges", "reasons"),
    [
        pytest.param({}, [], id="no-readings"),
        pytest.param({"clock_event_reasons": 0x0}, [], id="nothing"),
        pytest.param({"clock_event_reasons": 0x1 | 0x2 | 0x4 | 0x10}, [], id="normal-bits"),
        pytest.param({"clock_event_reasons": 0x8}, ["hw-slowdown"], id="hw-slowdown"),
        pytest.param(
            {"clock_event_reasons": 0x40 | 0x80},
            ["hw-thermal-slowdown", "hw-power-brake"],
            id="thermal-and-brake",
        ),
        pytest.param({"clock_event_reasons": 0x20}, ["sw-thermal-slowdown"], id="sw-thermal"),
        pytest.param(
            {"clock_event_reasons": 0, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410},
            ["sm-clock-low"],
            id="low-clock-unexplained",
        ),
        pytest.param(
            {"clock_event_reasons": 0x1, "sm_clock_mhz": 210, "sm_clock_max_mhz": 1410},
            [],
            id="low-clock-idle",
        ),
        pytest.param(
            {"clock_event_reasons": 0x4, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410},
            [],
            id="low-clock-power-cap",
        ),
        pytest.param(
            {"clock_event_reasons": 0x8, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410},
            ["hw-slowdown"],
            id="low-clock-named",
        ),
        pytest.param(
            {"clock_event_reasons": 0, "sm_clock_mhz": 1300, "sm_clock_max_mhz": 1410},
            [],
            id="clock-near-max",
        ),
    ],
)
def test_clocks(gauges: dict[str, int], reasons: list[str]) -> None:
    assert [s.reason for s in signals.clocks(gauges, low_ratio=0.6)] == reasons


def test_busy_only_where_the_vendor_says() -> None:
    assert signals.busy({}) is None  # CNDev, DCMI: unknown, so the link speed is not judged
    assert signals.busy({"busy": 0}) is False
    assert signals.busy({"busy": 1}) is True


def test_memory_pending_and_ecc_rising() -> None:
    assert [s.reason for s in signals.memory_pending({"row_remap_pending": 1})] == [
        "row-remap-pending"
    ]
    assert signals.memory_pending({"retired_pages_pending": 0}) == []
    assert signals.ecc_rising(None, 0, now=100.0, window=60.0) == []
    assert [s.reason for s in signals.ecc_rising(50.0, 3, now=100.0, window=60.0)] == [
        "ecc-correctable-rising"
    ]
    assert signals.ecc_rising(30.0, 3, now=100.0, window=60.0) == []


def test_measured_tflops_against_the_profile() -> None:
    database = default_database()
    a100 = Device(
        "gpu",
        Vendor.NVIDIA,
        "A100-SXM4-80GB",
        0,
        "0000:17:00.0",
        80 * 2**30,
        tflops_fp16=312.0,
        attributes=(("profile", "nvidia/A100-SXM4-80GB"),),
    )
    assert signals.tflops_ratio(a100, database) is None  # profile figures: nothing measured
    slow = replace(
        a100, tflops_fp16=200.0, attributes=(*a100.attributes, ("fingerprint", "measured"))
    )
    ratio = signals.tflops_ratio(slow, database)
    assert ratio == pytest.approx(200 / 312)
    assert [s.reason for s in signals.below_profile(ratio, threshold=0.8)] == [
        "below-profile-tflops"
    ]
    assert signals.below_profile(0.9, threshold=0.8) == []
    unknown = replace(slow, attributes=(("profile", "unknown"), ("fingerprint", "measured")))
    assert signals.tflops_ratio(unknown, database) is None


@pytest.mark.parametrize(
    ("code", "severity", "counts"),
    [
        pytest.param("ecc_correctable", Severity.CORRECTABLE, True, id="nvml-dcmi-cndev-counter"),
        pytest.param("xid-92", Severity.CORRECTABLE, True, id="xid-92-high-sbe-rate"),
        pytest.param("hbm-ecc", Severity.CORRECTABLE, True, id="ascend-hbm-ecc-line"),
        pytest.param("aer-correctable", Severity.CORRECTABLE, False, id="pcie-not-memory"),
        pytest.param("xid-48", Severity.FATAL, False, id="fatal-is-the-analyzers"),
    ],
)
def test_corrections_from_counters_and_kernel_lines(
    tmp_path: Path, clock: Clock, code: str, severity: Severity, counts: bool
) -> None:
    settings = HealthSection(subhealth_hold=10.0).subhealth_settings()
    watch = SubHealth(settings, clock, sysfs=str(tmp_path))
    device = Device("gpu", Vendor.NVIDIA, "A100-SXM4-80GB", 0, "", 80 * 2**30)
    for _ in range(3):
        watch.note("gpu", HealthEvent("0000:17:00.0", "nvidia", code, severity, "", 0.0))
        watch.check([device], {})
        clock.now += 5
    assert watch.held("gpu") == (
        (Signal("ecc-correctable-rising", "3 correctable memory error rise(s), the last 0s ago"),)
        if counts
        else ()
    )
