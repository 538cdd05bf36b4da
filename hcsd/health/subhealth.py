"""Sub-health: a device that works but runs below itself is `degraded`, with a named reason.

A signal (signals.py) must hold for `hold` seconds, seen on every check in between, before it
counts: one hot second or one slow reading is not a slow card. A signal that counts stops
counting only after `recovery` seconds found absent, so a condition that comes and goes keeps
the device degraded instead of flapping. A signal that drops out before it counted starts
its hold again. A check that cannot judge a kind (no reading, an idle device for a signal
that shows only under load) changes nothing about it: a hung card does not turn healthy.
Signals are held by kind (`pcie-link-width`), their figures in the detail. The clock is
injected: tests drive time, the daemon passes time.monotonic.

`SubHealth` gathers the signals of every device on each check (sysfs for the PCIe link of any
vendor, a backend's readings, the device record, the corrections seen as health events) and
feeds the tracker; the health watcher combines its verdict with the fault analyzer's, the
worse one winning, so sub-health never hides an unhealthy or lost device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsd.discovery.pci import read_function
from hcsd.health import signals
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.signals import Evidence, Signal
from hcsd.health.subhealth_state import SavedState
from hcsd.model import Device, Vendor
from hcsd.profiles.database import ProfileDatabase, default_database

__all__ = [
    "CORRECTION_CODES",
    "DYNAMIC_LINK_VENDORS",
    "LOAD_VENDORS",
    "SubHealth",
    "SubHealthSettings",
    "SubHealthTracker",
]

log = logging.getLogger(__name__)

#: Vendors whose devices narrow their PCIe link when idle (nvidia-smi: "generation and width
#: may be reduced when not in use"): their width is judged only while busy.
DYNAMIC_LINK_VENDORS = frozenset({Vendor.NVIDIA})
#: Vendors whose backend reports load (`busy`): the absence of a clock reason counts only while
#: busy. The others never say, so a reason's absence counts whenever the reasons were read.
LOAD_VENDORS = frozenset({Vendor.NVIDIA})

#: Health-event codes that are a corrected memory error: the vendor counters' names (NVML,
#: DCMI, CNDev, the Hygon tool) as the counter poller emits them, and the kernel lines that say
#: the same (NVIDIA Xid 63 row remapping and 92 high single-bit rate, Ascend HBM ECC,
#: Cambricon ECC).
CORRECTION_CODES = frozenset(
    {
        "ecc_correctable",
        "retired_pages",
        "remapped_rows_correctable",
        "xid-63",
        "xid-92",
        "hbm-ecc",
        "ecc",
    }
)


@dataclass(frozen=True, slots=True)
class SubHealthSettings:
    hold: float  # seconds a signal must hold before the device is degraded
    recovery: float  # seconds a counted signal must stay away before it is cleared
    clock_ratio: float  # SM clock under this share of its reference, while busy
    tflops_ratio: float  # measured FP16 TFLOPS under this share of the profile
    ecc_window: float  # corrections at most this far apart keep `ecc-correctable-rising`
    ignore: frozenset[str] = frozenset()  # reasons never tracked


@dataclass(slots=True)
class _Held:
    signal: Signal
    checked: float  # the time of the last check
    seen: bool | None = True  # the last check saw it, found it absent, or could not judge
    held_for: float = 0.0  # seconds seen, this run of sightings
    absent_for: float = 0.0  # seconds positively absent since it was last seen
    counts: bool = False


class SubHealthTracker:
    """Signals per device over time, by kind: which have held long enough, which cleared.

    Time is credited only between two checks that both judged the kind: the hold between two
    sightings, the recovery between two checks that found it absent. A check that could not
    judge it (the kind left out of the evidence) freezes the entry."""

    def __init__(self, hold: float, recovery: float, clock: Callable[[], float]) -> None:
        self.hold, self.recovery, self.clock = hold, recovery, clock
        self._signals: dict[str, dict[str, _Held]] = {}

    def update(self, uuid: str, evidence: Mapping[str, Signal | None]) -> bool:
        """Account one check of the device; True when the signals that count changed."""
        now = self.clock()
        tracked = self._signals.setdefault(uuid, {})
        before = self.reasons(uuid)
        for kind, held in list(tracked.items()):
            elapsed, before_seen = max(0.0, now - held.checked), held.seen
            held.checked = now
            if kind not in evidence:
                held.seen = None  # unknown: neither the hold nor the recovery advances
                continue
            signal = evidence[kind]
            if signal is not None:
                held.signal, held.seen, held.absent_for = signal, True, 0.0
                held.held_for += elapsed if before_seen else 0.0
                held.counts = held.counts or held.held_for >= self.hold
            elif not held.counts:
                del tracked[kind]  # broke its hold
            else:
                # gone since the last check that judged it; an unknown stretch is not credited
                held.absent_for += elapsed if before_seen is not None else 0.0
                held.seen = False
                if held.absent_for >= self.recovery:
                    del tracked[kind]  # cleared for the recovery time
        for kind, signal in evidence.items():
            if signal is not None and kind not in tracked:
                tracked[kind] = _Held(signal, now, counts=self.hold <= 0)
        return self.reasons(uuid) != before

    def held(self, uuid: str) -> tuple[Signal, ...]:
        """The signals that keep the device degraded, by reason."""
        tracked = self._signals.get(uuid, {})
        return tuple(tracked[r].signal for r in sorted(tracked) if tracked[r].counts)

    def reasons(self, uuid: str) -> tuple[str, ...]:
        return tuple(signal.reason for signal in self.held(uuid))

    def forget(self, uuid: str) -> None:
        self._signals.pop(uuid, None)

    def snapshot(self) -> dict[str, Any]:
        """Every entry as JSON data: what a restart needs not to start the holds again."""
        return {
            uuid: {
                kind: {
                    "detail": h.signal.detail,
                    "held_for": h.held_for,
                    "absent_for": h.absent_for,
                    "counts": h.counts,
                }
                for kind, h in tracked.items()
            }
            for uuid, tracked in self._signals.items()
            if tracked
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Entries from `snapshot`; the time since it was taken is unknown (frozen)."""
        now = self.clock()
        for uuid, tracked in data.items():
            for kind, h in tracked.items():
                self._signals.setdefault(uuid, {})[kind] = _Held(
                    Signal(kind, str(h["detail"])),
                    now,
                    seen=None,  # the time since the snapshot is not known
                    held_for=float(h["held_for"]),
                    absent_for=float(h["absent_for"]),
                    counts=bool(h["counts"]),
                )


class SubHealth:
    """Every device's signals, checked together on the health watcher's poll."""

    def __init__(
        self,
        settings: SubHealthSettings,
        clock: Callable[[], float],
        *,
        sysfs: str,
        database: ProfileDatabase | None = None,
        state_path: str | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.sysfs = Path(sysfs)
        self.database = database or default_database()
        self.tracker = SubHealthTracker(settings.hold, settings.recovery, clock)
        self._corrections: dict[str, tuple[float, int]] = {}  # uuid -> (last, count)
        self._failing: set[tuple[str, str]] = set()  # (uuid, source) warned about
        self.state = SavedState(state_path) if state_path else None
        if self.state is not None:
            self.tracker.restore(self.state.load())

    def note(self, uuid: str, event: HealthEvent) -> None:
        """A health event about the device: corrections feed `ecc-correctable-rising`."""
        if event.severity is Severity.CORRECTABLE and event.code in CORRECTION_CODES:
            _, count = self._corrections.get(uuid, (0.0, 0))
            self._corrections[uuid] = (self.clock(), count + 1)

    def _sources(
        self, device: Device, gauges: Mapping[str, int]
    ) -> dict[str, Callable[[], Evidence]]:
        s = self.settings
        last, count = self._corrections.get(device.uuid, (None, 0))
        return {
            "pcie-link": lambda: signals.pcie_link(
                read_function(self.sysfs, device.pci_bus_id) if device.pci_bus_id else None,
                busy=signals.busy(gauges),
                dynamic=device.vendor in DYNAMIC_LINK_VENDORS,
            ),
            "clocks": lambda: signals.clocks(
                gauges, low_ratio=s.clock_ratio, load_gated=device.vendor in LOAD_VENDORS
            ),
            "memory": lambda: signals.memory_pending(gauges),
            "corrections": lambda: signals.ecc_rising(
                last, count, now=self.clock(), window=s.ecc_window
            ),
            "profile": lambda: signals.below_profile(
                signals.tflops_ratio(device, self.database), threshold=s.tflops_ratio
            ),
        }

    def signals(self, device: Device, gauges: Mapping[str, int]) -> Evidence:
        """What the device shows now, every kind of evidence together. A source that fails
        (a device gone from sysfs mid-read, an attribute it cannot parse) leaves its kinds
        unknown and is warned about once per device, the others still count."""
        evidence: Evidence = {}
        for name, read in self._sources(device, gauges).items():
            try:
                evidence.update(read())
            except (OSError, ValueError) as e:
                if (device.uuid, name) not in self._failing:
                    self._failing.add((device.uuid, name))
                    log.warning("health: sub-health %s of %s unreadable: %s", name, device.uuid, e)
                continue
            self._failing.discard((device.uuid, name))
        return {k: v for k, v in evidence.items() if k not in self.settings.ignore}

    def check(
        self, devices: Iterable[Device], gauges: Mapping[str, Mapping[str, int]]
    ) -> list[str]:
        """Update every device; returns those whose counted signals changed."""
        changed = []
        for device in devices:
            if self.tracker.update(device.uuid, self.signals(device, gauges.get(device.uuid, {}))):
                changed.append(device.uuid)
        if self.state is not None:
            self.state.save(self.tracker.snapshot(), self.clock(), force=bool(changed))
        return changed

    def held(self, uuid: str) -> tuple[Signal, ...]:
        return tuple(s for s in self.tracker.held(uuid) if s.reason not in self.settings.ignore)

    def node_wide(self, uuids: Sequence[str]) -> frozenset[str]:
        """The clock reasons every device of the node holds (two devices at least): a chassis
        power brake, a hot room. One node-level condition, not each device degraded."""
        if len(uuids) < 2:
            return frozenset()
        common = set(signals.LOAD_CLOCK_KINDS)
        for uuid in uuids:
            common &= {s.reason for s in self.held(uuid)}
        return frozenset(common)
