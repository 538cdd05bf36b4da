"""Per-vendor readers of device memory per process: NVML, KFD sysfs, DCMI, CNDev."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import UsageReader

__all__ = ["readers_for"]


def readers_for(
    devices: Sequence[Device],
    *,
    nvml_library: str = "",
    dcmi_library: str = "/usr/local/dcmi/libdcmi.so",
    cndev_library: str = "/usr/local/neuware/lib64/libcndev.so",
    sysfs: Path = Path("/sys"),
) -> list[UsageReader]:
    """One reader per vendor present among the devices (libraries are opened on first read)."""
    from hcsd.watchdog.readers.cndev import CndevReader
    from hcsd.watchdog.readers.dcmi import DcmiReader
    from hcsd.watchdog.readers.kfd import KfdReader
    from hcsd.watchdog.readers.nvml import NvmlReader

    vendors = {d.vendor for d in devices}
    readers: list[UsageReader] = []
    if Vendor.NVIDIA in vendors:
        readers.append(NvmlReader(devices, library=nvml_library))
    if Vendor.HYGON in vendors:
        readers.append(KfdReader(devices, sysfs=sysfs))
    if Vendor.ASCEND in vendors:
        readers.append(DcmiReader(devices, library=dcmi_library))
    if Vendor.CAMBRICON in vendors:
        readers.append(CndevReader(devices, library=cndev_library))
    return readers
