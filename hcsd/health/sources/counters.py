"""Polling the vendors' own health views through the discovery backends.

The last resort when no kernel-log source runs, and a second opinion when one does: ECC and
link counters that a vendor library (NVML, DCMI, CNDev, …) reports without a kernel message.
Each backend returns monotonically increasing counters per device; any increase since the last
poll becomes one event, classified by the counter's name. A counter that goes down (driver
reload, device reset) only moves the baseline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from hcsd.discovery import DiscoveryBackend
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.sources.base import Emit

__all__ = ["COUNTER_SEVERITY", "CounterPoller"]

log = logging.getLogger(__name__)

COUNTER_SEVERITY: Mapping[str, Severity] = {
    "ecc_uncorrectable": Severity.FATAL,
    "row_remap_failures": Severity.FATAL,
    "device_errors": Severity.DEGRADING,
    "link_errors": Severity.DEGRADING,
    "ecc_correctable": Severity.CORRECTABLE,
    "retired_pages": Severity.CORRECTABLE,
    "pcie_replays": Severity.CORRECTABLE,
}


class CounterPoller:
    name = "vendor-counters"

    def __init__(
        self,
        backends: Sequence[DiscoveryBackend],
        bus_of: Callable[[str], str | None],
        *,
        interval: float,
    ) -> None:
        self.backends = list(backends)
        self.bus_of = bus_of
        self.interval = interval
        self._last: dict[tuple[str, str], int] = {}
        self.polls = 0

    def poll(self, emit: Emit) -> None:
        now = time.monotonic()
        for backend in self.backends:
            try:
                counters = backend.health_counters()
            except Exception as e:  # a vendor library failing must not stop health watching
                log.warning("health: %s counters unavailable: %s", backend.name, e)
                continue
            for uuid, values in counters.items():
                bus = self.bus_of(uuid)
                if bus is None:
                    continue
                for name, value in values.items():
                    severity = COUNTER_SEVERITY.get(name)
                    previous = self._last.get((uuid, name))
                    self._last[(uuid, name)] = value
                    if severity is None or previous is None or value <= previous:
                        continue
                    emit(
                        HealthEvent(
                            bus,
                            backend.name,
                            name,
                            severity,
                            f"{name} rose from {previous} to {value}",
                            now,
                            "vendor-counters",
                        )
                    )
        self.polls += 1
