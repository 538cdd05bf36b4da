"""Who else is on a device: the driver's own list of processes, for the measurement.

"Idle" in the ledger means only that no container was allocated the device; a process started
outside HCS (a debugging session on the host, a container run without the runtime hook) holds
no allocation but shares the device and would skew the figure. The VRAM watchdog's readers
already ask each vendor's management library which processes hold memory on which device
(NVML, KFD sysfs, DCMI, CNDev); the measurer asks them before a measurement (a device in use
is skipped) and after it (a figure taken while anyone else ran is discarded).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hcsd.discovery.settings import DiscoverySection
from hcsd.model import Device
from hcsd.watchdog.readers import readers_for
from hcsd.watchdog.usage import ReaderError, UsageReader

__all__ = ["DeviceProcesses"]

log = logging.getLogger(__name__)


class DeviceProcesses:
    """The pids each device's driver lists, from the watchdog's per-vendor readers."""

    def __init__(self, readers: Sequence[UsageReader]) -> None:
        self.readers = list(readers)

    @classmethod
    def for_devices(cls, devices: Sequence[Device], discovery: DiscoverySection) -> DeviceProcesses:
        return cls(readers_for(devices, discovery))

    def pids(self, uuid: str) -> set[int] | None:
        """The processes on the device; None when no reader lists them (unknown, not none)."""
        for reader in self.readers:
            try:
                sample = reader.read()
            except ReaderError as e:
                log.debug("measure: %s: no process list: %s", reader.name, e)
                continue
            if uuid in sample.per_process:
                return {p.pid for p in sample.processes if p.device_uuid == uuid}
        return None

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
