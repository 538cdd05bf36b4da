"""Sub-health: a device that works but runs below itself is `degraded`, with a named reason.

A signal (signals.py) must hold for `hold` seconds, seen on every check in between, before it
counts: one hot second or one slow reading is not a slow card. A signal that counts stops
counting only after `recovery` seconds without it, so a condition that comes and goes keeps
the device degraded instead of flapping. A signal that drops out before it counted starts
its hold again. The clock is injected: tests drive time, the daemon passes time.monotonic.

`SubHealth` gathers the signals of every device on each check (sysfs for the PCIe link of any
vendor, a backend's readings, the device record, the corrections seen as health events) and
feeds the tracker; the health watcher combines its verdict with the fault analyzer's, the
worse one winning, so sub-health never hides an unhealthy or lost device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hcsd.discovery.pci import read_function
from hcsd.health import signals
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.signals import Signal
from hcsd.model import Device
from hcsd.profiles.database import ProfileDatabase, default_database

__all__ = ["CORRECTION_CODES", "SubHealth", "SubHealthSettings", "SubHealthTracker"]

#: Health-event codes that are a corrected memory error: the vendor counters' names (NVML,
#: DCMI, CNDev, the Hygon tool) as the counter poller emits them, and the kernel lines that say
#: the same (NVIDIA Xid 63 row remapping and 92 high single-bit rate, Ascend HBM ECC,
#: Cambricon ECC).
CORRECTION_CODES = frozenset(
    {"ecc_correctable", "retired_pages", "xid-63", "xid-92", "hbm-ecc", "ecc"}
)


@dataclass(frozen=True, slots=True)
class SubHealthSettings:
    hold: float  # seconds a signal must hold before the device is degraded
    recovery: float  # seconds a counted signal must stay away before it is cleared
    clock_ratio: float  # SM clock under this share of its maximum, while busy
    tflops_ratio: float  # measured FP16 TFLOPS under this share of the profile
    ecc_window: float  # corrections at most this far apart keep `ecc-correctable-rising`


@dataclass(slots=True)
class _Held:
    signal: Signal
    since: float  # first seen, this run of sightings
    last_seen: float
    counts: bool = False


class SubHealthTracker:
    """Signals per device over time: which have held long enough, which cleared."""

    def __init__(self, hold: float, recovery: float, clock: Callable[[], float]) -> None:
        self.hold, self.recovery, self.clock = hold, recovery, clock
        self._signals: dict[str, dict[str, _Held]] = {}

    def update(self, uuid: str, seen: Iterable[Signal]) -> bool:
        """Account one check of the device; True when the signals that count changed."""
        now = self.clock()
        tracked = self._signals.setdefault(uuid, {})
        before = self.reasons(uuid)
        current = {signal.reason: signal for signal in seen}
        for reason, signal in current.items():
            held = tracked.get(reason)
            if held is None:
                held = tracked[reason] = _Held(signal, now, now)
            held.signal, held.last_seen = signal, now
            held.counts = held.counts or now - held.since >= self.hold
        for reason in [r for r in tracked if r not in current]:
            held = tracked[reason]
            if not held.counts or now - held.last_seen >= self.recovery:
                del tracked[reason]  # broke its hold, or cleared for the recovery time
        return self.reasons(uuid) != before

    def held(self, uuid: str) -> tuple[Signal, ...]:
        """The signals that keep the device degraded, by reason."""
        tracked = self._signals.get(uuid, {})
        return tuple(tracked[r].signal for r in sorted(tracked) if tracked[r].counts)

    def reasons(self, uuid: str) -> tuple[str, ...]:
        return tuple(signal.reason for signal in self.held(uuid))

    def forget(self, uuid: str) -> None:
        self._signals.pop(uuid, None)


class SubHealth:
    """Every device's signals, checked together on the health watcher's poll."""

    def __init__(
        self,
        settings: SubHealthSettings,
        clock: Callable[[], float],
        *,
        sysfs: str,
        database: ProfileDatabase | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.sysfs = Path(sysfs)
        self.database = database or default_database()
        self.tracker = SubHealthTracker(settings.hold, settings.recovery, clock)
        self._corrections: dict[str, tuple[float, int]] = {}  # uuid -> (last, count)

    def note(self, uuid: str, event: HealthEvent) -> None:
        """A health event about the device: corrections feed `ecc-correctable-rising`."""
        if event.severity is Severity.CORRECTABLE and event.code in CORRECTION_CODES:
            _, count = self._corrections.get(uuid, (0.0, 0))
            self._corrections[uuid] = (self.clock(), count + 1)

    def signals(self, device: Device, gauges: Mapping[str, int]) -> list[Signal]:
        """What the device shows now, every kind of evidence together."""
        s = self.settings
        function = read_function(self.sysfs, device.pci_bus_id) if device.pci_bus_id else None
        last, count = self._corrections.get(device.uuid, (None, 0))
        return [
            *signals.pcie_link(function, busy=signals.busy(gauges)),
            *signals.clocks(gauges, low_ratio=s.clock_ratio),
            *signals.memory_pending(gauges),
            *signals.ecc_rising(last, count, now=self.clock(), window=s.ecc_window),
            *signals.below_profile(
                signals.tflops_ratio(device, self.database), threshold=s.tflops_ratio
            ),
        ]

    def check(
        self, devices: Iterable[Device], gauges: Mapping[str, Mapping[str, int]]
    ) -> list[str]:
        """Update every device; returns those whose counted signals changed."""
        changed = []
        for device in devices:
            try:
                seen = self.signals(device, gauges.get(device.uuid, {}))
            except (OSError, ValueError):
                seen = []  # a device gone from sysfs mid-read: hot-plug's business
            if self.tracker.update(device.uuid, seen):
                changed.append(device.uuid)
        return changed

    def held(self, uuid: str) -> tuple[Signal, ...]:
        return self.tracker.held(uuid)
