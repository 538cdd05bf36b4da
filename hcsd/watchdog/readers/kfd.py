"""Hygon DCUs (and any amdgpu/KFD device): device memory per process from KFD's sysfs.

The KFD driver keeps, for every process that opened /dev/kfd, a directory
`class/kfd/kfd/proc/<pid>` (the pid as the host sees it) with one file `vram_<gpu_id>` per GPU
holding the VRAM that process has allocated there, in bytes (kfd_process.c,
`kfd_procfs_add_sysfs_files`; since Linux 5.8). `<gpu_id>` is the GPU's KFD id, the same number
as `class/kfd/kfd/topology/nodes/<N>/gpu_id`, whose node `properties` give the PCI location
that names the device. Hygon's hydcu driver is amdgpu's KFD under another name and keeps this
layout. Device totals come from amdgpu's `mem_info_vram_used`.

Only sysfs is read: no library, no ioctl, nothing a container can influence.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from hcsd.discovery import pci
from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import DeviceTotal, ProcessUsage, ReaderError, Sample, UsageReader

__all__ = ["KfdReader"]

log = logging.getLogger(__name__)


class KfdReader(UsageReader):
    name = "kfd"

    def __init__(self, devices: Sequence[Device], *, sysfs: Path) -> None:
        self.by_bus = {
            pci.normalise_address(d.pci_bus_id): d.uuid
            for d in devices
            if d.vendor is Vendor.HYGON and d.pci_bus_id
        }
        self.sysfs = sysfs
        self.kfd = sysfs / "class" / "kfd" / "kfd"
        self._gpu_ids: dict[int, str] = {}

    def read(self) -> Sample:
        if not self._gpu_ids:
            self._gpu_ids = self._map_gpu_ids()
        sample = Sample()
        for bus, uuid in self.by_bus.items():
            used = _read_int(self.sysfs / "bus" / "pci" / "devices" / bus / "mem_info_vram_used")
            if used is not None:
                sample.totals.append(DeviceTotal(uuid, used))
        proc = self.kfd / "proc"
        try:
            entries = list(os.scandir(proc))
        except FileNotFoundError:
            return sample  # a kernel before 5.8: device totals only
        except OSError as e:
            raise ReaderError(f"failed to list {proc}: {e.strerror}") from e
        remapped = False
        for entry in entries:
            if not entry.name.isdigit():
                continue
            for gpu_id, used in _vram_files(entry.path):
                if gpu_id not in self._gpu_ids and not remapped:
                    self._gpu_ids, remapped = self._map_gpu_ids(), True  # a hot-plugged GPU
                if (device := self._gpu_ids.get(gpu_id)) is not None:
                    sample.processes.append(ProcessUsage(device, int(entry.name), used))
        sample.per_process.update(self._gpu_ids.values())
        return sample

    def _map_gpu_ids(self) -> dict[int, str]:
        """KFD gpu_id -> device uuid, through each topology node's PCI location."""
        nodes = self.kfd / "topology" / "nodes"
        try:
            paths = list(nodes.iterdir())
        except OSError as e:
            raise ReaderError(f"failed to read the KFD topology at {nodes}: {e.strerror}") from e
        mapping = {}
        for path in paths:
            gpu_id = _read_int(path / "gpu_id")
            if not gpu_id:
                continue  # a CPU node
            try:
                bus = _bus((path / "properties").read_text())
            except (OSError, ValueError):
                continue
            if bus in self.by_bus:
                mapping[gpu_id] = self.by_bus[bus]
        return mapping


def _vram_files(directory: str) -> list[tuple[int, int]]:
    found = []
    try:
        with os.scandir(directory) as files:
            for entry in files:
                if entry.name.startswith("vram_") and entry.name[5:].isdigit():
                    used = _read_int(Path(entry.path))
                    if used is not None:
                        found.append((int(entry.name[5:]), used))
    except OSError:
        pass  # the process exited while we looked
    return found


def _bus(properties: str) -> str:
    values = {}
    for line in properties.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    location = values["location_id"]
    return pci.normalise_address(
        f"{values.get('domain', 0):04x}:{location >> 8:02x}:"
        f"{(location & 0xFF) >> 3:02x}.{location & 0x7}"
    )


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_bytes().strip() or b"x")
    except (OSError, ValueError):
        return None
