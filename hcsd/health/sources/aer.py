"""PCIe AER counters from sysfs, polled: `aer_dev_{correctable,nonfatal,fatal}` per device.

The fallback for kernels without the `ras:aer_event` tracepoint (this one included). Each file
holds lines `NAME COUNT` ending with `TOTAL_ERR_COR`, `TOTAL_ERR_NONFATAL` or
`TOTAL_ERR_FATAL`; a rise of the total since the last poll is one event per kind.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

from hcsd.health.events import HealthEvent, Severity
from hcsd.health.sources.base import Emit

__all__ = ["AerPoller", "read_total"]

KINDS = (
    ("correctable", "TOTAL_ERR_COR", Severity.CORRECTABLE, "aer-correctable"),
    ("nonfatal", "TOTAL_ERR_NONFATAL", Severity.DEGRADING, "aer-nonfatal"),
    ("fatal", "TOTAL_ERR_FATAL", Severity.FATAL, "aer-fatal"),
)


def read_total(path: str, key: str) -> int | None:
    """The TOTAL_* counter of one aer_dev_* file; None when absent or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(16384)
    except OSError:
        return None
    for line in data.decode("ascii", errors="replace").splitlines():
        name, _, value = line.strip().partition(" ")
        if name == key and value.strip().isdigit():
            return int(value.strip())
    return None


class AerPoller:
    name = "aer-sysfs"

    def __init__(self, bus_ids: Iterable[str], *, sysfs: str, interval: float):
        self.bus_ids = list(bus_ids)
        self.sysfs = sysfs
        self.interval = interval
        self._last: dict[tuple[str, str], int] = {}
        self.polls = 0

    def poll(self, emit: Emit) -> None:
        now = time.monotonic()
        for bus in self.bus_ids:
            base = os.path.join(self.sysfs, "bus", "pci", "devices", bus)
            for kind, key, severity, code in KINDS:
                total = read_total(os.path.join(base, f"aer_dev_{kind}"), key)
                if total is None:
                    continue
                previous = self._last.get((bus, kind))
                self._last[(bus, kind)] = total
                if previous is not None and total > previous:
                    emit(
                        HealthEvent(
                            bus,
                            "pci",
                            code,
                            severity,
                            f"{key} rose from {previous} to {total}",
                            now,
                            "sysfs",
                        )
                    )
        self.polls += 1

    async def run(self, emit: Emit) -> None:
        while True:
            self.poll(emit)
            await asyncio.sleep(self.interval)
