"""What a health source reports: one kernel event about one device, classified."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["HealthEvent", "Severity"]


class Severity(enum.IntEnum):
    """How much an event says about the device itself.

    APPLICATION: the workload's fault (e.g. Xid 13, an illegal address): not counted.
    CORRECTABLE: a fault the hardware fixed; a rising rate predicts failure.
    DEGRADING: a real device fault that did not stop it (ring timeout, reset that recovered).
    FATAL: the device cannot be trusted (fell off the bus, uncorrectable ECC, fatal AER).
    """

    APPLICATION = 0
    CORRECTABLE = 1
    DEGRADING = 2
    FATAL = 3


@dataclass(frozen=True, slots=True)
class HealthEvent:
    bus_id: str  # normalised PCI address, "0000:3b:00.0"; "" when not device-specific
    vendor: str  # "nvidia", "hygon", "ascend", "cambricon", "pci"
    code: str  # "xid-79", "aer-fatal", "ring-timeout", ...
    severity: Severity
    message: str  # the kernel line, cut to a sane length for logs
    time: float  # monotonic seconds when hcsd received it
    source: str = ""  # "ebpf", "bcc", "kmsg", "sysfs"
