"""Hot-plug: a PCI function that disappears marks its device lost, at once.

The monitor's socket is watched by the event loop itself (no thread, no polling interval), so a
remove uevent becomes `NodeService.set_device(... LOST)` — visible in the API watch and the
metrics — within milliseconds. Allocations on the device are kept (the ledger never drops what
a container holds) and each is logged, so that the operator knows which containers to move.
A function that comes back (add) is rediscovered and its record replaces the lost one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from hcsd.discovery.uevents import PciEvent, PciMonitor
from hcsd.health.watching import HEALTH_ATTRIBUTES, SUBHEALTH_ATTRIBUTES
from hcsd.model import Device, HealthState
from hcsd.service import NodeService
from hcsd.tasks import supervise

__all__ = ["HotplugWatcher"]

log = logging.getLogger(__name__)


class HotplugWatcher:
    def __init__(
        self,
        service: NodeService,
        monitor: PciMonitor,
        rediscover: Callable[[], Sequence[Device]],
    ) -> None:
        self.service = service
        self.monitor = monitor
        self.rediscover = rediscover
        self.lost = 0
        self.returned = 0

    async def run(self) -> None:
        """Serve events until cancelled."""
        loop = asyncio.get_running_loop()
        fd = self.monitor.fileno()
        loop.add_reader(fd, self._readable)
        try:
            await asyncio.Event().wait()
        finally:
            loop.remove_reader(fd)
            self.monitor.close()

    def _readable(self) -> None:
        for event in self.monitor.read():
            self.handle(event)

    def handle(self, event: PciEvent) -> None:
        device = self.service.device_at_bus(event.address)
        if event.action == "remove" and device is not None:
            self._mark_lost(device)
        elif (
            event.action == "add"
            and event.vendor is not None
            and (device is None or device.health_state is HealthState.LOST)
        ):
            supervise(self._readd(event.address), f"hotplug-add {event.address}")

    def _mark_lost(self, device: Device) -> None:
        if device.health_state is HealthState.LOST:
            return
        self.lost += 1
        # why, as health.watching says it (the ComputeNode's reason, the metric's label); a
        # device off the bus runs below nothing: its sub-health words go with it
        dropped = (*HEALTH_ATTRIBUTES, *SUBHEALTH_ATTRIBUTES)
        attributes = tuple((k, v) for k, v in device.attributes if k not in dropped)
        attributes += (("health_reason", "removed from the bus"),)
        attributes += (("health_cause", "removed from the bus"),)
        self.service.set_device(
            replace(device, health_state=HealthState.LOST, health_score=0, attributes=attributes)
        )
        log.error(
            "hot-plug: device %s (%s) was removed from the bus: lost",
            device.uuid,
            device.pci_bus_id,
        )
        for allocation in self.service.holders(device.uuid):
            who = (
                f"{allocation.pod}/{allocation.container_name}"
                if allocation.pod.name
                else allocation.container_id
            )
            log.error("%s: holds lost device %s", who, device.uuid)

    async def _readd(self, address: str) -> None:
        found = await asyncio.to_thread(self.rediscover)
        for device in found:
            if device.pci_bus_id == address:
                self.returned += 1
                self.service.set_device(device)
                log.warning("hot-plug: device %s (%s) is back", device.uuid, address)
