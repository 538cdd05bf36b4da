"""What a vendor's management interface says about device memory, in one shape for all vendors.

A reader turns one vendor's view (NVML, KFD sysfs, DCMI, CNDev) into a `Sample`: the memory
each process holds on each device (host pids, bytes), and where the vendor reports it, each
device's total use. Readers never interpret: mapping pids to containers and comparing with
grants happen elsewhere, the same way for every vendor.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

__all__ = ["DeviceTotal", "ProcessUsage", "ReaderError", "Sample", "UsageReader"]


class ReaderError(Exception):
    """Reading failed this time (library missing, device lost, call refused); the next poll
    tries again, so the watchdog logs it and carries on."""


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """Device memory one process holds on one device, as the vendor's driver counts it."""

    device_uuid: str
    pid: int  # in the host's pid namespace, which is hcsd's
    used_bytes: int


@dataclass(frozen=True, slots=True)
class DeviceTotal:
    """A device's memory in use, all processes and the driver's own reservations together."""

    device_uuid: str
    used_bytes: int


@dataclass(slots=True)
class Sample:
    """One reader's answer to one poll.

    `per_process` names the devices whose process list is complete: a device missing there
    (the vendor offers no per-process figures, or the query failed) is judged on its total
    only, and no process on it is ever blamed.
    """

    processes: list[ProcessUsage] = field(default_factory=list)
    totals: list[DeviceTotal] = field(default_factory=list)
    per_process: set[str] = field(default_factory=set)
    unmeasured: int = 0  # processes listed without a usable figure (NVML's "not available")


class UsageReader(abc.ABC):
    """One vendor's per-process (and per-device) memory figures for the devices it was given."""

    #: Short name for logs and metrics (`nvml`, `kfd`, `dcmi`, `cndev`).
    name: str = ""

    @abc.abstractmethod
    def read(self) -> Sample:
        """The current figures. Raise ReaderError when nothing can be read this time."""

    def close(self) -> None:  # noqa: B027 - optional hook, sysfs readers hold nothing
        """Release library handles; called once at shutdown."""
