"""Hot-plug: a real kernel remove uevent, through pyudev's netlink monitor, marks a device lost.

The kernel sends a synthetic uevent when an action is written to a device's `uevent` file
(Documentation/ABI/testing/sysfs-uevent): the event travels the same netlink path as a real
removal, and nothing acts on it where udevd is absent. The test runs only there, as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from hcsd.daemon.hotplug import HotplugWatcher
from hcsd.discovery import Inventory
from hcsd.discovery.uevents import UDEVD_CONTROL, PciEvent, PciMonitor
from hcsd.ledger import Ledger
from hcsd.model import Allocation, Device, Grant, HealthState, PodRef, Vendor
from hcsd.service import EventKind, NodeService

GiB = 2**30
PCI = Path("/sys/bus/pci/devices")


def _device(bus: str, uuid: str = "GPU-hotplug") -> Device:
    return Device(
        uuid=uuid, vendor=Vendor.NVIDIA, model="A100", index=0, pci_bus_id=bus, vram_bytes=80 * GiB
    )


def _service(ledger: Ledger, device: Device) -> NodeService:
    service = NodeService(Inventory("node", (device,), ("test",)), ledger)
    service.hold(
        Allocation(
            "ctr-1", (Grant(device.uuid, 8 * GiB),), pod=PodRef("ns", "pod"), container_name="main"
        )
    )
    return service


def _real_function() -> str | None:
    if os.geteuid() != 0 or os.path.exists(UDEVD_CONTROL) or not PCI.is_dir():
        return None
    for path in sorted(PCI.iterdir()):
        if os.access(path / "uevent", os.W_OK):
            return path.name
    return None


@pytest.mark.skipif(_real_function() is None, reason="needs root, a writable sysfs and no udevd")
async def test_a_kernel_remove_event_marks_the_device_lost_within_a_second(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    bus = _real_function()
    assert bus is not None
    service = _service(ledger, _device(bus))
    watch = service.subscribe(send_initial=False)
    watcher = HotplugWatcher(service, PciMonitor(source="kernel"), rediscover=list)
    task = asyncio.create_task(watcher.run())
    await asyncio.sleep(0)  # let the watcher register its reader
    started = time.monotonic()
    (PCI / bus / "uevent").write_text("remove")
    async with asyncio.timeout(1.0):
        async for event in watch:
            if event.kind == EventKind.DEVICE_CHANGED and event.device is not None:
                break
    elapsed = time.monotonic() - started
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    status = service.device_status("GPU-hotplug")
    assert status is not None and status.device.health_state is HealthState.LOST
    assert status.allocations == 1  # kept, and reported
    assert "ns/pod/main: holds lost device GPU-hotplug" in caplog.text
    assert elapsed < 1.0


async def test_a_device_that_comes_back_is_rediscovered(ledger: Ledger) -> None:
    device = _device("0000:17:00.0")
    service = _service(ledger, device)

    class NoMonitor:
        def fileno(self) -> int:
            return -1

    watcher = HotplugWatcher(service, NoMonitor(), rediscover=lambda: [device])  # type: ignore[arg-type]
    watcher.handle(PciEvent("remove", "0000:17:00.0", Vendor.NVIDIA))
    assert service.device("GPU-hotplug").health_state is HealthState.LOST  # type: ignore[union-attr]
    watcher.handle(PciEvent("remove", "0000:17:00.0", Vendor.NVIDIA))  # once is enough
    assert watcher.lost == 1
    watcher.handle(PciEvent("add", "0000:17:00.0", Vendor.NVIDIA))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if watcher.returned:
            break
    assert service.device("GPU-hotplug").health_state is HealthState.HEALTHY  # type: ignore[union-attr]


async def test_events_for_other_functions_change_nothing(ledger: Ledger) -> None:
    service = _service(ledger, _device("0000:17:00.0"))
    watcher = HotplugWatcher(service, None, rediscover=list)  # type: ignore[arg-type]
    watcher.handle(PciEvent("remove", "0000:99:00.0", None))
    watcher.handle(PciEvent("change", "0000:17:00.0", Vendor.NVIDIA))
    assert service.device("GPU-hotplug").health_state is HealthState.HEALTHY  # type: ignore[union-attr]
