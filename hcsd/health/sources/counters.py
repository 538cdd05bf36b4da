"""Polling the vendors' own health views through the discovery backends.

The last resort when no kernel-log source runs, and a second opinion when one does: ECC and
link counters that a vendor library (NVML, DCMI, CNDev, …) reports without a kernel message.
Each backend returns monotonically increasing counters per device; any increase since the last
poll becomes one event, classified by the counter's name. A counter that goes down (driver
reload, device reset) only moves the baseline. The same pool task brings the backend's
sub-health readings (clock event reasons, SM clock, utilization, pending retirements), kept in
`gauges` for the sub-health check; either call may fail without the other's results lost.

The vendor calls (NVML, DCMI, CNDev through ctypes; a CLI for others) block, and a dying device
can make them hang: they run on a small thread pool of their own, never on the event loop, with
a timeout. A backend whose call did not return in time is logged and skipped until that call
comes back; there is never more than one call per backend in flight, so a hung library holds at
most one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
    "retirement_failures": Severity.FATAL,
    "device_errors": Severity.DEGRADING,
    "link_errors": Severity.DEGRADING,
    "ecc_correctable": Severity.CORRECTABLE,
    "remapped_rows_correctable": Severity.CORRECTABLE,
    "retired_pages": Severity.CORRECTABLE,
    "pcie_replays": Severity.CORRECTABLE,
}


Counters = dict[str, dict[str, int]]
# (health_counters, health_gauges), each None when its call failed (the failure logged)
Readings = tuple[Counters | None, Counters | None]


def _read(backend: DiscoveryBackend) -> Readings:
    """One backend's counters and sub-health readings, in one task on the pool (a hung
    library holds one thread, whichever of the two it hangs in), each call on its own: a
    failing readings call must not stop the counters (fatal ECC detection), nor the other way."""
    results: list[Counters | None] = []
    for what, call in (("counters", backend.health_counters), ("readings", backend.health_gauges)):
        try:
            results.append(call())
        except Exception as e:  # a vendor library failing must not stop health watching
            log.warning("health: %s %s unavailable: %s", backend.name, what, e)
            results.append(None)
    return results[0], results[1]


class CounterPoller:
    name = "vendor-counters"

    def __init__(
        self,
        backends: Sequence[DiscoveryBackend],
        bus_of: Callable[[str], str | None],
        *,
        interval: float,
        timeout: float = 2.0,
    ) -> None:
        self.backends = list(backends)
        self.bus_of = bus_of
        self.interval = interval
        self.timeout = timeout
        self._last: dict[tuple[str, str], int] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, len(self.backends)), thread_name_prefix="hcs-vendor-poll"
        )
        self._hung: dict[str, tuple[asyncio.Future[Readings], float]] = {}
        #: The last poll's sub-health readings per device uuid, from the backends that answered.
        self.gauges: dict[str, dict[str, int]] = {}
        self.polls = 0
        self.timeouts = 0

    async def poll(self, emit: Emit) -> None:
        """Read every backend's counters off the event loop; emit an event per increase."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        calls: dict[str, asyncio.Future[Readings]] = {}
        for backend in self.backends:
            if not self._still_hung(backend.name, loop):
                calls[backend.name] = loop.run_in_executor(self._pool, _read, backend)
        if calls:
            await asyncio.wait(calls.values(), timeout=self.timeout)
        now = time.monotonic()
        gauges: dict[str, dict[str, int]] = {}  # no answer, no reading: never a stale one
        for backend in self.backends:
            call = calls.get(backend.name)
            if call is None:
                continue
            if not call.done():
                self._hung[backend.name] = (call, started)
                self.timeouts += 1
                log.warning(
                    "health: %s counters did not answer within %.1fs; skipping that backend "
                    "until the call returns",
                    backend.name,
                    self.timeout,
                )
                continue
            counters, readings = call.result()
            if counters is not None:
                self._account(backend.name, counters, now, emit)
            if readings is not None:
                gauges.update(readings)
        self.gauges = gauges
        self.polls += 1

    def close(self) -> None:
        """Stop the pool without waiting for a hung vendor call (its thread is abandoned)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _still_hung(self, name: str, loop: asyncio.AbstractEventLoop) -> bool:
        hung = self._hung.get(name)
        if hung is None:
            return False
        call, started = hung
        if not call.done():
            return True
        del self._hung[name]
        failed = call.cancelled() or call.exception() is not None  # its result is stale: unused
        log.warning(
            "health: %s counters call %s within %.0fs; polling it again",
            name,
            "failed" if failed else "came back",
            loop.time() - started,
        )
        return False

    def _account(self, source: str, counters: Counters, now: float, emit: Emit) -> None:
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
                        source,
                        name,
                        severity,
                        f"{name} rose from {previous} to {value}",
                        now,
                        "vendor-counters",
                    )
                )
