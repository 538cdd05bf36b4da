"""Huawei Ascend: device memory per process from DCMI (`libdcmi.so`).

`dcmi_get_device_resource_info(card, chip, struct dcmi_proc_mem_info *proc_info, int
*proc_num)` fills an array of `{int proc_id; unsigned long proc_mem_usage;}` (host pid, bytes:
"the memory consumed by the device OS for the process and the memory allocated to its
services") with at most 32 entries (dcmi_interface_api.h and Huawei's DCMI API reference). The
array handed over has room for 64, so a library that ever fills more than it documents cannot
write past it. Chips are matched to devices by PCI location (`dcmi_get_device_pcie_info_v2`),
like discovery does. Device totals: HBM in use (`dcmi_get_device_hbm_info`, MB).

Where the call is missing (an old driver) or answers "not supported", the chip is watched on
its total only.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from hcsd.discovery import pci
from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import DeviceTotal, ProcessUsage, ReaderError, Sample, UsageReader

__all__ = ["DcmiReader", "ProcMemInfo"]

log = logging.getLogger(__name__)

MiB = 2**20
ROOM = 64  # entries handed to DCMI (it documents at most 32)


class ProcMemInfo(ctypes.Structure):
    """struct dcmi_proc_mem_info (16 bytes on LP64)."""

    _fields_ = [("proc_id", ctypes.c_int), ("proc_mem_usage", ctypes.c_ulong)]


class _Pcie(ctypes.Structure):
    _fields_ = [
        ("venderid", ctypes.c_uint),
        ("subvenderid", ctypes.c_uint),
        ("deviceid", ctypes.c_uint),
        ("subdeviceid", ctypes.c_uint),
        ("domain", ctypes.c_int),
        ("bdf_busid", ctypes.c_uint),
        ("bdf_deviceid", ctypes.c_uint),
        ("bdf_funcid", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 32),
    ]


class _Hbm(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class DcmiReader(UsageReader):
    name = "dcmi"

    def __init__(self, devices: Sequence[Device], *, library: str) -> None:
        self.by_bus = {
            pci.normalise_address(d.pci_bus_id): d.uuid
            for d in devices
            if d.vendor is Vendor.ASCEND and d.pci_bus_id
        }
        self.library = library
        self._lib: Any = None
        self._chips: dict[str, tuple[int, int]] = {}  # uuid -> (card, chip)
        self._buffer = (ProcMemInfo * ROOM)()

    def read(self) -> Sample:
        if self._lib is None:
            self._open()
        sample = Sample()
        per_process = hasattr(self._lib, "dcmi_get_device_resource_info")
        for uuid, (card, chip) in self._chips.items():
            hbm = _Hbm()
            if self._lib.dcmi_get_device_hbm_info(card, chip, ctypes.byref(hbm)) == 0:
                sample.totals.append(DeviceTotal(uuid, int(hbm.memory_usage) * MiB))
            if not per_process:
                continue
            count = ctypes.c_int(0)
            code = self._lib.dcmi_get_device_resource_info(
                card, chip, self._buffer, ctypes.byref(count)
            )
            if code != 0:
                log.debug("dcmi: processes on %s unavailable: DCMI error %d", uuid, code)
                continue
            for entry in self._buffer[: max(0, min(count.value, ROOM))]:
                if entry.proc_id > 0:
                    sample.processes.append(
                        ProcessUsage(uuid, int(entry.proc_id), int(entry.proc_mem_usage))
                    )
            sample.per_process.add(uuid)
        return sample

    def _open(self) -> None:
        try:
            lib = ctypes.CDLL(self.library)
        except OSError as e:
            raise ReaderError(f"failed to load DCMI ({self.library}): {e}") from e
        if (code := lib.dcmi_init()) != 0:
            raise ReaderError(f"failed to initialise DCMI: error {code}")
        count, cards = ctypes.c_int(), (ctypes.c_int * 64)()
        if lib.dcmi_get_card_num_list(ctypes.byref(count), cards, 64) != 0:
            raise ReaderError("failed to list Ascend cards through DCMI")
        chips = {}
        for card in cards[: max(0, min(count.value, 64))]:
            per_card = ctypes.c_int()
            if lib.dcmi_get_device_num_in_card(card, ctypes.byref(per_card)) != 0:
                continue
            for chip in range(max(0, min(per_card.value, 16))):
                pcie = _Pcie()
                if lib.dcmi_get_device_pcie_info_v2(card, chip, ctypes.byref(pcie)) != 0:
                    continue
                bus = pci.normalise_address(
                    f"{pcie.domain:04x}:{pcie.bdf_busid:02x}:"
                    f"{pcie.bdf_deviceid:02x}.{pcie.bdf_funcid}"
                )
                if bus in self.by_bus:
                    chips[self.by_bus[bus]] = (card, chip)
        self._lib, self._chips = lib, chips
        if not hasattr(lib, "dcmi_get_device_resource_info"):
            log.warning(
                "dcmi: this DCMI has no dcmi_get_device_resource_info: NPUs are watched on "
                "their total memory only, no process can be blamed"
            )
