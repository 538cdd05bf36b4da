"""The discovery backends as the daemon builds them from `[discovery]`.

`discovery.backends = ["auto"]` (the default) runs the backend of every vendor whose
accelerators are on the PCI bus, so one config file fits every node of a mixed cluster. The PCI
bus, not a library that loads, decides: a vendor library can be installed on a node without the
device, and a device whose driver is missing must fail discovery with that reason rather than
vanish. Each vendor `auto` does not run gets one info line and a note that `hcsctl status`
shows, so a node with zero devices says why. Every backend takes the discovery section whole
(paths of sysfs, /dev, its library and tools). Vendor modules are imported only when their
backend runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hcsd.daemon.hotplug import HotplugWatcher
from hcsd.discovery import DiscoveryBackend, discover_all, pci
from hcsd.discovery.settings import VENDOR_BACKENDS, DiscoverySection
from hcsd.discovery.uevents import PciMonitor
from hcsd.model import Device, Vendor
from hcsd.service import NodeService

__all__ = ["BACKENDS", "Plan", "build_backends", "expand_auto", "hotplug_watcher", "plan"]

log = logging.getLogger(__name__)


def _simulated(settings: DiscoverySection) -> DiscoveryBackend:
    from hcsd.discovery.backends.simulated import SimulatedBackend

    return SimulatedBackend(Path(settings.simulated_node))


def _nvidia(settings: DiscoverySection) -> DiscoveryBackend:
    from hcsd.discovery.backends.nvidia import NvidiaBackend

    return NvidiaBackend(settings)


def _ascend(settings: DiscoverySection) -> DiscoveryBackend:
    from hcsd.discovery.backends.ascend import AscendBackend

    return AscendBackend(settings)


def _hygon(settings: DiscoverySection) -> DiscoveryBackend:
    from hcsd.discovery.backends.hygon import HygonBackend

    return HygonBackend(settings)


def _cambricon(settings: DiscoverySection) -> DiscoveryBackend:
    from hcsd.discovery.backends.cambricon import CambriconBackend

    return CambriconBackend(settings)


#: One factory per name that `discovery.backends` accepts (BACKEND_NAMES, checked by a test).
BACKENDS: dict[str, Callable[[DiscoverySection], DiscoveryBackend]] = {
    "simulated": _simulated,
    "nvidia": _nvidia,
    "ascend": _ascend,
    "hygon": _hygon,
    "cambricon": _cambricon,
}


#: What each vendor's accelerators are called in the note when `auto` finds none.
_PRODUCTS = {
    Vendor.NVIDIA: "NVIDIA GPU",
    Vendor.ASCEND: "Huawei Ascend NPU",
    Vendor.HYGON: "Hygon DCU",
    Vendor.CAMBRICON: "Cambricon MLU",
}


@dataclass(frozen=True, slots=True)
class Plan:
    """The backends to run, in order, and why each vendor `auto` leaves out does not run."""

    names: tuple[str, ...]
    notes: tuple[str, ...] = ()


def plan(settings: DiscoverySection) -> Plan:
    """`auto` becomes the vendors present on the PCI bus, in a fixed order, once each; every
    vendor it leaves out is logged (info) and noted with the reason."""
    names: list[str] = []
    notes: list[str] = []
    for name in settings.backends:
        if name != "auto":
            names.append(name)
            continue
        present = {f.vendor.value for f in pci.scan(Path(settings.sysfs)) if f.vendor}
        found = [vendor for vendor in VENDOR_BACKENDS if vendor in present]
        log.info("discovery: auto found %s on the PCI bus", ", ".join(found) or "no accelerator")
        for vendor_id, vendor in pci.VENDOR_IDS.items():
            if vendor.value in present or vendor.value in settings.backends:
                continue
            note = (
                f"{vendor.value}: not run, no {_PRODUCTS[vendor]} on the PCI bus (vendor "
                f"{vendor_id:#06x}, display or accelerator class, in {settings.sysfs})"
            )
            log.info("discovery: %s", note)
            notes.append(note)
        names.extend(found)
    return Plan(tuple(dict.fromkeys(names)), tuple(notes))


def expand_auto(settings: DiscoverySection) -> list[str]:
    """The backend names to run, `auto` expanded (see `plan`)."""
    return list(plan(settings).names)


def build_backends(
    settings: DiscoverySection, chosen: Plan | None = None
) -> list[DiscoveryBackend]:
    """The backends to run (the section has already refused unknown names)."""
    return [BACKENDS[name](settings) for name in (chosen or plan(settings)).names]


def hotplug_watcher(
    settings: DiscoverySection,
    service: NodeService,
    backends: Sequence[DiscoveryBackend],
    refine: Callable[[Device], Device] = lambda device: device,
) -> HotplugWatcher | None:
    """A watcher of PCI removals, when enabled and a real backend runs (simulated devices sit
    at made-up addresses that the kernel never reports). `refine` turns a rediscovered device
    into what the daemon serves (its measured figures applied)."""
    if not settings.hotplug or not any(b.name in VENDOR_BACKENDS for b in backends):
        return None
    try:
        monitor = PciMonitor()
    except (OSError, ImportError) as e:
        log.warning("hot-plug: cannot watch PCI uevents (%s): removed devices show at restart", e)
        return None
    log.info("hot-plug: watching PCI uevents from %s", monitor.source)

    def rediscover() -> Sequence[Device]:
        return [refine(d) for d in discover_all(service.node_name, backends).devices]

    return HotplugWatcher(service, monitor, rediscover)
