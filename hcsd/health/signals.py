"""Sub-health signals: evidence that a device runs below itself, without any fault event.

A signal names its reason in stable words (`pcie-link-x8-of-x16`, `hw-slowdown`, …: a
metric label and what the cluster side matches on) and says the figures in `detail`. The
readers here are pure over their inputs (a PCI function read from sysfs, a backend's
readings, the device record, the time of the last correction), so the daemon and the tests
feed them alike; `subhealth.SubHealthTracker` decides when a signal has held long enough.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hcsd.discovery.pci import PciFunction
from hcsd.model import Device
from hcsd.profiles.database import ProfileDatabase

__all__ = [
    "CLOCK_REASONS",
    "Signal",
    "below_profile",
    "busy",
    "clocks",
    "ecc_rising",
    "memory_pending",
    "pcie_link",
    "tflops_ratio",
]

# NVML's nvmlClocksEventReason* bits (nvml.h) that mean the board or the driver holds the clocks
# down against the workload: a slowdown signal (HW_SLOWDOWN), overheating (the thermal ones),
# the power brake (an external signal from the chassis). Idle, application clocks, the
# software power cap (normal under full load), sync boost and display clocks are not faults.
CLOCK_REASONS = (
    (0x0000000000000008, "hw-slowdown"),
    (0x0000000000000020, "sw-thermal-slowdown"),
    (0x0000000000000040, "hw-thermal-slowdown"),
    (0x0000000000000080, "hw-power-brake"),
)
_EXPLAINED = 0x0000000000000001 | 0x0000000000000002 | 0x0000000000000004  # idle, app, power cap


@dataclass(frozen=True, slots=True)
class Signal:
    reason: str  # stable: the same words while the condition lasts
    detail: str  # the figures behind it, for logs and the ComputeNode


def pcie_link(function: PciFunction | None, *, busy: bool | None) -> list[Signal]:
    """The link trained below what both ends can do (sysfs, any vendor).

    Fewer lanes than the maximum is the classic down-trained card, whatever the load. A lower
    speed counts only while the device is known to be busy (`busy` True): GPUs drop the
    link to its lowest speed when idle to save power, and a device whose backend cannot say
    whether it is busy (None) is judged on its width alone.
    """
    if function is None or not function.max_link_width:
        return []
    signals = []
    width, top = function.link_width, function.max_link_width
    if 0 < width < top:
        signals.append(
            Signal(
                f"pcie-link-x{width}-of-x{top}",
                f"PCIe link x{width} at {function.link_speed:g} GT/s; the device can do x{top}",
            )
        )
    speed, fastest = function.link_speed, function.max_link_speed
    if busy and 0 < speed < fastest:
        signals.append(
            Signal(
                f"pcie-speed-{speed:g}gt-of-{fastest:g}gt",
                f"PCIe link at {speed:g} GT/s while busy; the device can do {fastest:g} GT/s",
            )
        )
    return signals


def busy(gauges: Mapping[str, int]) -> bool | None:
    """Whether the device is working (its clocks not idle); None when the backend cannot say."""
    value = gauges.get("busy")
    return None if value is None else bool(value)


def clocks(gauges: Mapping[str, int], *, low_ratio: float) -> list[Signal]:
    """Clocks held down by the hardware (NVML's event reasons), and an SM clock under
    `low_ratio` of its maximum that nothing normal explains (idle, application clocks, the
    power cap) and no named reason already covers."""
    reasons = gauges.get("clock_event_reasons")
    if reasons is None:
        return []
    sm, top = gauges.get("sm_clock_mhz", 0), gauges.get("sm_clock_max_mhz", 0)
    at = f"SM clock {sm} of {top} MHz" if top else "SM clock unknown"
    signals = [
        Signal(name, f"clock event reasons {reasons:#x} ({name}); {at}")
        for bit, name in CLOCK_REASONS
        if reasons & bit
    ]
    if not signals and not reasons & _EXPLAINED and top and 0 < sm < low_ratio * top:
        signals.append(Signal("sm-clock-low", f"{at} while busy, reasons {reasons:#x}"))
    return signals


def memory_pending(gauges: Mapping[str, int]) -> list[Signal]:
    """A page retirement or a row remap the driver applies only at the next GPU reset: the
    memory is already known bad and the device runs without the fix until then."""
    signals = []
    if gauges.get("retired_pages_pending"):
        signals.append(Signal("retired-pages-pending", "a retired page waits for a GPU reset"))
    if gauges.get("row_remap_pending"):
        signals.append(Signal("row-remap-pending", "a remapped row waits for a GPU reset"))
    return signals


def ecc_rising(last: float | None, count: int, *, now: float, window: float) -> list[Signal]:
    """Corrected memory errors kept coming: the last rise of a correctable counter (ECC,
    retired pages, remapped rows; any vendor's) is at most `window` seconds old. Held for the
    hold time, that is a correction at least every `window` seconds all along."""
    if last is None or now - last > window:
        return []
    return [
        Signal(
            "ecc-correctable-rising",
            f"{count} correctable memory error rise(s), the last {now - last:.0f}s ago",
        )
    ]


def tflops_ratio(device: Device, database: ProfileDatabase) -> float | None:
    """Measured FP16 TFLOPS over the profile's, for a device this node measured (attribute
    fingerprint=measured, its figure in `tflops_fp16`) of a known model; None otherwise.

    The one place the measured fingerprint enters sub-health: a node that records its
    measurement another way changes only this function.
    """
    attributes = dict(device.attributes)
    if attributes.get("fingerprint") != "measured" or device.tflops_fp16 <= 0:
        return None
    profiles = database.find(attributes.get("profile", ""))
    if len(profiles) != 1 or profiles[0].figure("tflops_fp16") <= 0:
        return None
    return device.tflops_fp16 / profiles[0].figure("tflops_fp16")


def below_profile(ratio: float | None, *, threshold: float) -> list[Signal]:
    if ratio is None or ratio >= threshold:
        return []
    return [
        Signal(
            "below-profile-tflops",
            f"measured {ratio:.0%} of the profile's FP16 TFLOPS (under {threshold:.0%})",
        )
    ]
