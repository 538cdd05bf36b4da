"""Sub-health signals: evidence that a device runs below itself, without any fault event.

A signal's reason is its kind in stable words (`pcie-link-width`, `hw-slowdown`, …: the key
the tracker holds it by, a metric label, what the cluster side matches on); the figures go to
`detail`, so a link that alternates x8 and x4 is one signal that holds.

Every reader returns `Evidence`: for each kind it could judge, the signal when seen or None
when positively absent; a kind it could not judge (the backend timed out, a reading failed,
the device idle for a signal that only shows under load) is left out, and the tracker leaves
such an entry as it is. Missing evidence is never taken for a signal gone.

The readers are pure over their inputs (a PCI function read from sysfs, a backend's readings,
the device record, the time of the last correction), so the daemon and the tests feed them
alike; `subhealth.SubHealthTracker` decides when a signal has held long enough.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hcsd.discovery.pci import PciFunction
from hcsd.model import Device
from hcsd.profiles.database import ProfileDatabase

__all__ = [
    "CLOCK_REASONS",
    "KINDS",
    "LOAD_CLOCK_KINDS",
    "Evidence",
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
# the power brake (an external signal from the chassis).
CLOCK_REASONS = (
    (0x0000000000000008, "hw-slowdown"),
    (0x0000000000000020, "sw-thermal-slowdown"),
    (0x0000000000000040, "hw-thermal-slowdown"),
    (0x0000000000000080, "hw-power-brake"),
)
# Application clocks: the SM clock is then judged against the application clock, not the
# maximum. Every other bit (idle 0x1, the software power cap 0x4, sync boost 0x10, display
# clocks 0x100, and what newer drivers add: board limit 0x200, reliability 0x400) explains a
# low clock; the fault bits above raise their own signals.
_APPLICATION_CLOCKS = 0x0000000000000002

#: Every reason a signal can carry, in the order they are listed to users.
KINDS = (
    "pcie-link-width",
    "pcie-link-speed",
    *(name for _, name in CLOCK_REASONS),
    "sm-clock-low",
    "retired-pages-pending",
    "row-remap-pending",
    "ecc-correctable-rising",
    "below-profile-tflops",
)
#: The kinds that say the clocks are held down: node-wide when every device shows one.
LOAD_CLOCK_KINDS = (*(name for _, name in CLOCK_REASONS), "sm-clock-low")


@dataclass(frozen=True, slots=True)
class Signal:
    reason: str  # the kind, one of KINDS: the same words while the condition lasts
    detail: str  # the figures behind it, for logs and the ComputeNode


Evidence = dict[str, Signal | None]  # kind -> seen (Signal) or absent (None); unknown: left out


def pcie_link(function: PciFunction | None, *, busy: bool | None, dynamic: bool) -> Evidence:
    """The link trained below what both ends can do (sysfs, any vendor).

    The maximum is the lower of the device's and its upstream port's (a Gen5 card in a Gen4
    slot is not down-trained). A lower speed is judged only while the device is known to be
    busy: GPUs drop the link speed when idle to save power. Vendors that also narrow the link
    when idle (`dynamic`: NVIDIA) have their width judged only while busy too; for the others
    fewer lanes than the maximum is the classic down-trained card, whatever the load.
    """
    if function is None or not function.link_cap_width:
        return {}
    evidence: Evidence = {}
    width, top = function.link_width, function.link_cap_width
    if busy or not dynamic:
        evidence["pcie-link-width"] = (
            Signal(
                "pcie-link-width",
                f"PCIe link x{width} at {function.link_speed:g} GT/s; the link can do x{top}",
            )
            if 0 < width < top
            else None
        )
    speed, fastest = function.link_speed, function.link_cap_speed
    if busy:
        evidence["pcie-link-speed"] = (
            Signal(
                "pcie-link-speed",
                f"PCIe link at {speed:g} GT/s x{width} while busy; the link can do "
                f"{fastest:g} GT/s",
            )
            if 0 < speed < fastest
            else None
        )
    return evidence


def busy(gauges: Mapping[str, int]) -> bool | None:
    """Whether the device is working; None when the backend cannot say."""
    value = gauges.get("busy")
    return None if value is None else bool(value)


def clocks(gauges: Mapping[str, int], *, low_ratio: float, load_gated: bool = True) -> Evidence:
    """Clocks held down by the hardware (NVML's event reasons), and an SM clock under
    `low_ratio` of its reference (the application clock when one is set, else the maximum)
    that no reason bit explains.

    A reason bit seen counts whatever the load. For a vendor that reports load
    (`load_gated`), its absence, and the SM clock's judgement, count only while the device is
    busy (an idle board says little about its clocks); for one that never says (CNDev), a bit's
    absence counts whenever the reasons were read."""
    reasons = gauges.get("clock_event_reasons")
    if reasons is None:
        return {}
    working = busy(gauges)
    judged = working or not load_gated
    sm = gauges.get("sm_clock_mhz", 0)
    top = gauges.get("sm_clock_max_mhz", 0)
    applications = gauges.get("sm_clock_applications_mhz", 0)
    reference = applications if reasons & _APPLICATION_CLOCKS and applications else top
    at = f"SM clock {sm} of {top} MHz" if top else "SM clock unknown"
    if reference != top:
        at += f" (application clock {reference} MHz)"
    evidence: Evidence = {}
    for bit, name in CLOCK_REASONS:
        if reasons & bit:
            evidence[name] = Signal(name, f"clock event reasons {reasons:#x} ({name}); {at}")
        elif judged:
            evidence[name] = None
    if working and reference and sm:
        unexplained = not reasons & ~_APPLICATION_CLOCKS
        evidence["sm-clock-low"] = (
            Signal("sm-clock-low", f"{at} while busy, reasons {reasons:#x}")
            if unexplained and sm < low_ratio * reference
            else None
        )
    return evidence


def memory_pending(gauges: Mapping[str, int]) -> Evidence:
    """A page retirement or a row remap the driver applies only at the next GPU reset: the
    memory is already known bad and the device runs without the fix until then."""
    evidence: Evidence = {}
    for key, name, text in (
        ("retired_pages_pending", "retired-pages-pending", "a retired page"),
        ("row_remap_pending", "row-remap-pending", "a remapped row"),
    ):
        if key in gauges:
            evidence[name] = Signal(name, f"{text} waits for a GPU reset") if gauges[key] else None
    return evidence


def ecc_rising(last: float | None, count: int, *, now: float, window: float) -> Evidence:
    """Corrected memory errors kept coming: the last rise of a correctable counter (ECC,
    retired pages, remapped rows; any vendor's) is at most `window` seconds old. Held for the
    hold time, that is a correction at least every `window` seconds all along."""
    if last is None or now - last > window:
        return {"ecc-correctable-rising": None}
    return {
        "ecc-correctable-rising": Signal(
            "ecc-correctable-rising",
            # no "…s ago": the detail is shown long after it was written (the ComputeNode)
            f"{count} correctable memory error rise(s) since hcsd started, the latest at most "
            f"{window:.0f}s before the last check",
        )
    }


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


def below_profile(ratio: float | None, *, threshold: float) -> Evidence:
    """A measured device far under its model's peak. A broken one, not a slow one: the
    threshold is low, since good devices reach well under the vendor's dense peak; comparing
    with the fleet's median is the cluster side's job."""
    if ratio is None or ratio >= threshold:
        return {"below-profile-tflops": None}
    return {
        "below-profile-tflops": Signal(
            "below-profile-tflops",
            f"measured {ratio:.0%} of the profile's FP16 TFLOPS (under {threshold:.0%})",
        )
    }
