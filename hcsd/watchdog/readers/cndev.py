"""Cambricon MLUs: device memory per process from CNDev (`libcndev.so`).

`cndevGetProcessInfo(unsigned *infoCount, cndevProcessInfo_t *procInfo, cndevDevice_t dev)`
fills `{int version; unsigned pid; uint64 physicalMemoryUsed; uint64 virtualMemoryUsed;}` per
process (host pids; memory in KiB, cndev.h). `*infoCount` is the room on the way in and the
number of processes on the way out; too little room answers CNDEV_ERROR_INSUFFICIENT_SPACE
(9) with the number needed. The caller sets `version` (CNDEV_VERSION_5, as discovery uses).
Cards are matched to devices by PCI location. Device totals: `cndevGetMemoryUsage` (MB).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from hcsd.discovery import pci
from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import DeviceTotal, ProcessUsage, ReaderError, Sample, UsageReader

__all__ = ["CndevReader", "ProcessInfo"]

log = logging.getLogger(__name__)

VERSION = 5
INSUFFICIENT_SPACE = 9
KiB, MiB = 2**10, 2**20
MAX_ENTRIES = 65536


class ProcessInfo(ctypes.Structure):
    """cndevProcessInfo_t (24 bytes)."""

    _fields_ = [
        ("version", ctypes.c_int),
        ("pid", ctypes.c_uint),
        ("physicalMemoryUsed", ctypes.c_uint64),
        ("virtualMemoryUsed", ctypes.c_uint64),
    ]


def _versioned(*fields: tuple[str, Any]) -> type[ctypes.Structure]:
    """A CNDev structure with room to spare for a library that fills a newer layout."""
    return type(
        "S",
        (ctypes.Structure,),
        {"_fields_": [("version", ctypes.c_int), *fields, ("_spare", ctypes.c_ubyte * 512)]},
    )


_Count = _versioned(("number", ctypes.c_uint))
_Memory = _versioned(("total", ctypes.c_int64), ("used", ctypes.c_int64))
_Pcie = _versioned(
    ("subsystem_id", ctypes.c_uint),
    ("device_id", ctypes.c_uint),
    ("vendor", ctypes.c_uint16),
    ("subsystem_vendor", ctypes.c_uint16),
    ("domain", ctypes.c_uint),
    ("bus", ctypes.c_uint),
    ("device", ctypes.c_uint),
    ("function", ctypes.c_uint),
)


class CndevReader(UsageReader):
    name = "cndev"

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        library: str,
    ) -> None:
        self.by_bus = {
            pci.normalise_address(d.pci_bus_id): d.uuid
            for d in devices
            if d.vendor is Vendor.CAMBRICON and d.pci_bus_id
        }
        self.library = library
        self._lib: Any = None
        self._cards: dict[str, int] = {}  # uuid -> handle
        self._list: Any = None  # cndevGetProcessInfo, where the library has it
        self._buffer: Any = (ProcessInfo * 64)()

    def read(self) -> Sample:
        if self._lib is None:
            self._open()
        sample = Sample()
        for uuid, handle in self._cards.items():
            memory = _Memory(version=VERSION)
            if self._lib.cndevGetMemoryUsage(ctypes.byref(memory), handle) == 0:
                sample.totals.append(DeviceTotal(uuid, int(memory.used) * MiB))
            listed = self._processes(uuid, handle)
            if listed is None:
                continue
            for entry in listed:
                sample.processes.append(
                    ProcessUsage(uuid, int(entry.pid), int(entry.physicalMemoryUsed) * KiB)
                )
            sample.per_process.add(uuid)
        return sample

    def close(self) -> None:
        if self._lib is not None:
            self._lib.cndevRelease()
            self._lib = None

    def _processes(self, uuid: str, handle: int) -> list[Any] | None:
        if self._list is None:
            return None
        for _ in range(4):
            self._buffer[0].version = VERSION
            count = ctypes.c_uint(len(self._buffer))
            code = self._list(ctypes.byref(count), self._buffer, handle)
            if code == 0:
                return list(self._buffer[: min(count.value, len(self._buffer))])
            if code != INSUFFICIENT_SPACE or count.value > MAX_ENTRIES:
                log.debug("cndev: processes on %s unavailable: CNDev error %d", uuid, code)
                return None
            self._buffer = (ProcessInfo * max(count.value * 2, len(self._buffer)))()
        return None

    def _open(self) -> None:
        try:
            lib = ctypes.CDLL(self.library)
        except OSError as e:
            raise ReaderError(f"failed to load CNDev ({self.library}): {e}") from e
        if (code := lib.cndevInit(0)) != 0:
            raise ReaderError(f"failed to initialise CNDev: error {code}")
        self._list = getattr(lib, "cndevGetProcessInfo", None)
        if self._list is None:
            log.warning("cndev: no cndevGetProcessInfo: MLUs are watched on their totals only")
        count = _Count(version=VERSION)
        if lib.cndevGetDeviceCount(ctypes.byref(count)) != 0:
            raise ReaderError("failed to count MLUs through CNDev")
        cards = {}
        for index in range(min(count.number, 64)):
            handle = ctypes.c_int(index)
            if hasattr(lib, "cndevGetDeviceHandleByIndex") and (
                lib.cndevGetDeviceHandleByIndex(index, ctypes.byref(handle)) != 0
            ):
                continue
            pcie = _Pcie(version=VERSION)
            if lib.cndevGetPCIeInfo(ctypes.byref(pcie), handle.value) != 0:
                continue
            bus = pci.normalise_address(
                f"{pcie.domain:04x}:{pcie.bus:02x}:{pcie.device:02x}.{pcie.function}"
            )
            if bus in self.by_bus:
                cards[self.by_bus[bus]] = handle.value
        self._lib, self._cards = lib, cards
