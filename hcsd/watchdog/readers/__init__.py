"""Per-vendor readers of device memory per process: NVML, KFD sysfs, DCMI, CNDev."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hcsd.discovery.settings import DiscoverySection
from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import UsageReader

__all__ = ["readers_for"]


def readers_for(devices: Sequence[Device], discovery: DiscoverySection) -> list[UsageReader]:
    """One reader per vendor present among the devices (libraries are opened on first read),
    with the libraries and the sysfs root that discovery uses."""
    from hcsd.watchdog.readers.cndev import CndevReader
    from hcsd.watchdog.readers.dcmi import DcmiReader
    from hcsd.watchdog.readers.kfd import KfdReader
    from hcsd.watchdog.readers.nvml import NvmlReader

    vendors = {d.vendor for d in devices}
    readers: list[UsageReader] = []
    if Vendor.NVIDIA in vendors:
        readers.append(NvmlReader(devices, library=discovery.nvml_library))
    if Vendor.HYGON in vendors:
        readers.append(KfdReader(devices, sysfs=Path(discovery.sysfs)))
    if Vendor.ASCEND in vendors:
        readers.append(DcmiReader(devices, library=discovery.dcmi_library))
    if Vendor.CAMBRICON in vendors:
        readers.append(CndevReader(devices, library=discovery.cndev_library))
    return readers
