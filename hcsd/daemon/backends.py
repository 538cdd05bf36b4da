"""The real discovery backends as the daemon builds them from its configuration.

`discovery.backends = ["auto"]` runs the backend of every vendor whose accelerators are on the
PCI bus, so one config file fits every node of a mixed cluster. Every path a backend reads
(sysfs, /dev, libraries, tools) comes from a `discovery.*` key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from hcsd.daemon.config import Config
from hcsd.daemon.hotplug import HotplugWatcher
from hcsd.discovery import DiscoveryBackend, discover_all, pci
from hcsd.discovery.uevents import PciMonitor
from hcsd.model import Device
from hcsd.service import NodeService

__all__ = ["VENDOR_BACKENDS", "expand_auto", "hotplug_watcher"]

log = logging.getLogger(__name__)


def _roots(config: Config) -> dict[str, Path]:
    return {
        "sysfs": Path(config.values["discovery.sysfs"]),
        "dev_root": Path(config.values["discovery.dev_root"]),
    }


def _nvidia(config: Config) -> DiscoveryBackend:
    from hcsd.discovery.backends.nvidia import NvidiaBackend

    return NvidiaBackend(library=config.values["discovery.nvml_library"], **_roots(config))


def _ascend(config: Config) -> DiscoveryBackend:
    from hcsd.discovery.backends.ascend import AscendBackend

    v = config.values
    return AscendBackend(
        library=v["discovery.dcmi_library"], npu_smi=v["discovery.npu_smi"], **_roots(config)
    )


def _hygon(config: Config) -> DiscoveryBackend:
    from hcsd.discovery.backends.hygon import HygonBackend

    return HygonBackend(hy_smi=config.values["discovery.hy_smi"], **_roots(config))


def _cambricon(config: Config) -> DiscoveryBackend:
    from hcsd.discovery.backends.cambricon import CambriconBackend

    v = config.values
    return CambriconBackend(
        library=v["discovery.cndev_library"], cnmon=v["discovery.cnmon"], **_roots(config)
    )


VENDOR_BACKENDS: dict[str, Callable[[Config], DiscoveryBackend]] = {
    "nvidia": _nvidia,
    "ascend": _ascend,
    "hygon": _hygon,
    "cambricon": _cambricon,
}


def expand_auto(names: Sequence[str], config: Config) -> list[str]:
    """`auto` becomes the vendors present on the PCI bus, in a fixed order, once each."""
    result: list[str] = []
    for name in names:
        if name != "auto":
            result.append(name)
            continue
        present = {
            f.vendor.value for f in pci.scan(Path(config.values["discovery.sysfs"])) if f.vendor
        }
        found = [vendor for vendor in VENDOR_BACKENDS if vendor in present]
        log.info("discovery: auto found %s on the PCI bus", ", ".join(found) or "no accelerator")
        result.extend(found)
    return list(dict.fromkeys(result))


def hotplug_watcher(
    config: Config, service: NodeService, backends: Sequence[DiscoveryBackend]
) -> HotplugWatcher | None:
    """A watcher of PCI removals, when enabled and a real backend runs (simulated devices sit
    at made-up addresses that the kernel never reports)."""
    if not config.values["discovery.hotplug"] or not any(
        b.name in VENDOR_BACKENDS for b in backends
    ):
        return None
    try:
        monitor = PciMonitor()
    except (OSError, ImportError) as e:
        log.warning("hot-plug: cannot watch PCI uevents (%s): removed devices show at restart", e)
        return None
    log.info("hot-plug: watching PCI uevents from %s", monitor.source)

    def rediscover() -> Sequence[Device]:
        return discover_all(service.node_name, backends).devices

    return HotplugWatcher(service, monitor, rediscover)
