"""PCI hot add and remove, from the kernel's uevents through pyudev's netlink monitor.

Only what a handler needs is kept from an event: the action and the bus address (the
`PCI_SLOT_NAME` property, present on remove too, when sysfs no longer has the device). Where
udevd runs, its processed events are read (nodes exist by then); without udevd, the kernel's
own, so that a container or a minimal host still sees hot-plug.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hcsd.discovery import pci
from hcsd.model import Vendor

__all__ = ["PciEvent", "PciMonitor", "event_from_udev"]

UDEVD_CONTROL = "/run/udev/control"


@dataclass(frozen=True, slots=True)
class PciEvent:
    action: str  # "add", "remove", "change", "bind", "unbind", ...
    address: str
    vendor: Vendor | None


def event_from_udev(device: Any) -> PciEvent | None:
    """A PciEvent from a pyudev Device, or None for what is not a PCI function event."""
    properties = device.properties
    if properties.get("SUBSYSTEM") != "pci" or not device.action:
        return None
    try:
        address = pci.normalise_address(properties.get("PCI_SLOT_NAME") or device.sys_name)
    except ValueError:
        return None
    vendor_text = (properties.get("PCI_ID") or ":").split(":")[0]
    try:
        vendor = pci.VENDOR_IDS.get(int(vendor_text, 16))
    except ValueError:
        vendor = None
    return PciEvent(action=str(device.action), address=address, vendor=vendor)


class PciMonitor:
    """A non-blocking netlink monitor of PCI events; `fileno()` goes to the event loop."""

    def __init__(self, source: str = "auto") -> None:
        import pyudev

        if source == "auto":
            source = "udev" if os.path.exists(UDEVD_CONTROL) else "kernel"
        self.source = source
        self._monitor: Any = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        self._monitor.filter_by("pci")
        self._monitor.start()

    def fileno(self) -> int:
        return int(self._monitor.fileno())

    def read(self) -> list[PciEvent]:
        """Every event waiting now (never blocks)."""
        events = []
        while (device := self._monitor.poll(timeout=0)) is not None:
            if (event := event_from_udev(device)) is not None:
                events.append(event)
        return events

    def close(self) -> None:
        """Drop the monitor; libudev closes its socket when the last reference goes."""
        self._monitor = None
