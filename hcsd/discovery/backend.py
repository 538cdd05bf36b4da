"""The contract every discovery backend meets, and the merge of their results.

A backend knows one source of truth (a vendor management library, sysfs, a data file). It
returns complete `Device` records; the merge checks what no single backend can: unique UUIDs and
bus ids across vendors, and links that point at devices that exist.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hcsd.discovery.fabric import Fabric
from hcsd.model import Device

__all__ = ["DiscoveryBackend", "DiscoveryError", "Inventory", "discover_all"]

log = logging.getLogger(__name__)


class DiscoveryError(Exception):
    """A backend could not produce its devices (missing library, unreadable file, bad data)."""


class DiscoveryBackend(abc.ABC):
    """One source of devices. Real vendor backends and the simulated node implement this."""

    #: Short name used in config (`discovery.backends`) and in status output.
    name: str = ""

    @abc.abstractmethod
    def discover(self) -> Sequence[Device]:
        """Return every device this backend sees, fully described.

        Raise DiscoveryError when the source is present but unusable; return an empty list when
        this node simply has no such devices.
        """

    def health_counters(self) -> dict[str, dict[str, int]]:
        """Fault counters per device uuid, by name, each only ever increasing.

        The vendor's own health view (ECC errors, retired pages, link errors) for the health
        watcher's polling fallback, which turns every increase into an event. Names the
        watcher knows: ecc_uncorrectable, ecc_correctable, retired_pages, row_remap_failures,
        remapped_rows_correctable, retirement_failures, pcie_replays, link_errors,
        device_errors. Backends without such a view return {}.
        """
        return {}

    def health_gauges(self) -> dict[str, dict[str, int]]:
        """How each device runs right now, per device uuid, by name: readings, not counters.

        The sub-health signals' inputs (hcsd/health/signals.py): clock_event_reasons (NVML's
        nvmlClocksEventReason* bits; other vendors translate theirs into them), busy (1 while
        the device works, 0 while idle: only where the vendor says), sm_clock_mhz,
        sm_clock_max_mhz and sm_clock_applications_mhz, retired_pages_pending and
        row_remap_pending (1 while a retirement or remap waits for a reset). A reading the
        device does not support, or that failed, is left out; backends without such a view
        return {}.
        """
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release library handles; called once at shutdown."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """The node's devices as discovered, in a stable order (vendor, then index)."""

    node_name: str
    devices: tuple[Device, ...]
    backends: tuple[str, ...]
    #: Why a vendor's backend did not run ("nvidia: no NVIDIA GPU on the PCI bus …"), for
    #: `hcsctl status`: a node with zero devices says why.
    notes: tuple[str, ...] = ()
    #: The RDMA fabric the node is on (`hcsd.discovery.fabric`), set after the backends ran.
    fabric: Fabric = field(default_factory=Fabric)

    def by_uuid(self) -> dict[str, Device]:
        return {d.uuid: d for d in self.devices}


def discover_all(
    node_name: str, backends: Iterable[DiscoveryBackend], notes: Sequence[str] = ()
) -> Inventory:
    """Run every backend and merge the results, refusing an inconsistent inventory. `notes`
    (why other backends did not run) are kept with it."""
    devices: list[Device] = []
    names: list[str] = []
    for backend in backends:
        try:
            found = list(backend.discover())
        except DiscoveryError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DiscoveryError(f"failed to discover with {backend.name}: {e}") from e
        log.info("discovery backend %s found %d device(s)", backend.name, len(found))
        devices.extend(found)
        names.append(backend.name)
    _check_unique(devices)
    known = {d.uuid for d in devices}
    for device in devices:
        for link in device.links:
            if link.peer_uuid not in known:
                raise DiscoveryError(
                    f"device {device.uuid} has a link to unknown device {link.peer_uuid}"
                )
    devices.sort(key=lambda d: (d.vendor.value, d.index, d.pci_bus_id))
    return Inventory(
        node_name=node_name, devices=tuple(devices), backends=tuple(names), notes=tuple(notes)
    )


def _check_unique(devices: Sequence[Device]) -> None:
    seen_uuid: dict[str, Device] = {}
    seen_bus: dict[str, Device] = {}
    for device in devices:
        if device.uuid in seen_uuid:
            raise DiscoveryError(f"duplicate device uuid {device.uuid}")
        seen_uuid[device.uuid] = device
        if device.pci_bus_id and device.pci_bus_id in seen_bus:
            other = seen_bus[device.pci_bus_id]
            raise DiscoveryError(
                f"devices {other.uuid} and {device.uuid} share PCI bus id {device.pci_bus_id}"
            )
        seen_bus[device.pci_bus_id] = device
