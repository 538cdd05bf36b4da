"""When hcsd measures its devices (`[measure]`): at start, on demand, and on a schedule while a
device is idle; never on a device that holds an allocation.

The rule between a measurement and an allocation: the allocation wins. A device holding an
allocation is skipped, checked right before its worker starts; while the worker runs, the
ledger is asked every 20 ms whether an allocation arrived, and if one did the worker is killed
at once (its context and buffers go with the process) and the outcome is `aborted`, with no
figure. A container is therefore never refused or delayed for a measurement; the price is that
its first ~20 ms on the device may overlap the worker's last GEMM, while the container is still
being created.

A device in the ledger's sense idle may still be used by a process outside HCS: where the
vendor's management library lists the processes on a device (`occupants`), a device with any
is skipped, and a figure is discarded (outcome `aborted`) when a process other than the worker
is listed once it ended.

Measurements run one at a time (a device's figure is not disturbed by its neighbours' power
draw). A figure is recorded in the measured-figures file first and then applied to the device
(the service publishes the change: API watchers, the syncer's ComputeNode, the metrics). A
vendor whose library is missing or too old (a permanent error) is left out of scheduled runs
until hcsd restarts, after one warning; `hcsctl measure` always tries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

from hcsd.benchmarks import Measurement, MeasureSection, Outcome, apply_measurement
from hcsd.benchmarks.libraries import BenchmarkError
from hcsd.benchmarks.request import GemmRequest
from hcsd.benchmarks.running import MEASURABLE, Interrupted, run_worker
from hcsd.benchmarks.store import MeasuredStore
from hcsd.daemon.config import Config
from hcsd.daemon.occupants import DeviceProcesses
from hcsd.discovery import DiscoveryBackend
from hcsd.discovery.settings import VENDOR_BACKENDS
from hcsd.model import Device, Vendor
from hcsd.profiles import ProfileDatabase, default_database
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry

__all__ = ["Measurer", "build_measurer"]

log = logging.getLogger(__name__)

#: Seconds before the schedule retries a device whose measurement failed or was aborted (then
#: doubling per failure in a row, up to `interval`).
RETRY_AFTER = 600.0

RunWorker = Callable[..., Any]
#: The pids the driver lists on a device; None when unknown (no reader for its vendor).
Occupants = Callable[[str], "set[int] | None"]


class Measurer:
    def __init__(
        self,
        service: NodeService,
        settings: MeasureSection,
        store: MeasuredStore,
        *,
        vendors: Collection[Vendor],
        profiles: ProfileDatabase | None = None,
        clock: Callable[[], float] = time.time,
        run: RunWorker = run_worker,
        telemetry: Telemetry | None = None,
        occupants: Occupants = lambda uuid: None,
    ) -> None:
        self.service = service
        self.occupants = occupants
        self.settings = settings
        self.store = store
        self.vendors = frozenset(vendors)  # whose real backend runs (not simulated devices)
        self.profiles = profiles or default_database()
        self.clock = clock
        self._run = run
        self.telemetry = telemetry
        self._lock = asyncio.Lock()
        self._stored: dict[str, Measurement] = {}
        self._last: dict[str, float] = {}  # uuid -> when last measured
        self._retry: dict[str, tuple[float, int]] = {}  # uuid -> (not before, failures)
        self._busy: dict[str, float] = {}  # uuid -> when last seen holding an allocation
        self._broken: dict[Vendor, str] = {}  # a permanent failure: out of scheduled runs
        self.counts: Counter[str] = Counter()  # outcomes by status (hcs_measurements_total)
        self.current: str | None = None  # the device being measured

    # -- the figures on file --------------------------------------------------------------

    def restore(self) -> None:
        """Apply the measurements on file to the devices (before the API serves them). Never
        raises: a fault here would stop hcsd's start and systemd would restart it in a loop;
        the devices keep their profile figures instead."""
        try:
            self._stored = self.store.load()
        except Exception:  # the store logs what it knows; this is the last line of defence
            log.exception("measure: failed to load %s; devices keep their profile figures",
                          self.store.path)  # fmt: skip
            self._stored = {}
        for measurement in self._stored.values():
            self._last[measurement.uuid] = measurement.at
            device = self.service.device(measurement.uuid)
            if device is not None:
                self.service.set_device(self._apply(device, measurement))
        if self._stored:
            log.info("measure: %d device figure(s) from %s", len(self._stored), self.store.path)

    def refine(self, device: Device) -> Device:
        """A rediscovered device (hot-plug) with its measurement on file, if any."""
        measurement = self._stored.get(device.uuid)
        return self._apply(device, measurement) if measurement else device

    def _apply(self, device: Device, measurement: Measurement) -> Device:
        profile = self.profiles.lookup(device.vendor, device.model)
        return apply_measurement(device, measurement, profile)

    # -- passes ---------------------------------------------------------------------------

    async def measure(self, uuids: Sequence[str] = ()) -> list[Outcome]:
        """Measure the devices named (all when none), one after the other: `hcsctl measure`."""
        # each device once, in the order named (a UUID given twice is measured once)
        targets = list(dict.fromkeys(uuids)) or [s.device.uuid for s in self.service.devices()]
        async with self._lock:
            return [await self._one(uuid, scheduled=False) for uuid in targets]

    async def start_pass(self) -> list[Outcome]:
        """Every device once, at start; one whose figure on file is younger than `interval`
        keeps it (a restart does not re-measure the whole node)."""
        now = self.clock()
        outcomes = []
        async with self._lock:
            for status in self.service.devices():
                uuid = status.device.uuid
                age = now - self._last.get(uuid, float("-inf"))
                if self.settings.interval > 0 and age < self.settings.interval:
                    log.debug("measure: %s: measured %.0f s ago, kept", uuid, age)
                    continue
                outcomes.append(await self._one(uuid, scheduled=True))
        return outcomes

    async def run(self) -> None:
        """The supervised task: the start pass, then the schedule, until cancelled."""
        if self.settings.at_start:
            await self.start_pass()
        while True:
            await asyncio.sleep(self.settings.check_interval)
            for uuid in self.due():
                async with self._lock:
                    await self._one(uuid, scheduled=True)

    def due(self) -> list[str]:
        """The devices the schedule measures now: idle for `idle_for`, last measured `interval`
        ago or longer, and past the back-off of a failed or aborted try (RETRY_AFTER, doubling
        per failure, at most `interval`). Also notes which devices hold allocations (the idle
        clock)."""
        now = self.clock()
        for status in self.service.devices():
            if status.allocations:
                self._busy[status.device.uuid] = now
        if self.settings.interval <= 0:
            return []
        return [
            s.device.uuid
            for s in self.service.devices()
            if not s.allocations
            and now - self._busy.get(s.device.uuid, float("-inf")) >= self.settings.idle_for
            and now - self._last.get(s.device.uuid, float("-inf")) >= self.settings.interval
            and now >= self._retry.get(s.device.uuid, (float("-inf"), 0))[0]
            and self._why_not(s.device, scheduled=True) is None
        ]

    # -- one device -----------------------------------------------------------------------

    def _why_not(self, device: Device, *, scheduled: bool) -> str | None:
        if not device.health_state.schedulable:
            return f"device is {device.health_state.value}"
        if device.vendor not in MEASURABLE:
            return f"no GEMM measurement for {device.vendor.value} devices yet"
        if device.vendor not in self.vendors:
            return f"no {device.vendor.value} discovery backend runs (a simulated device)"
        if scheduled and device.vendor in self._broken:
            return f"{self._broken[device.vendor]} (until hcsd restarts; hcsctl measure retries)"
        return None

    def _taken(self, uuid: str) -> str | None:
        holders = self.service.holders(uuid)
        if not holders:
            return None
        who = holders[0]
        name = f"{who.pod}/{who.container_name}" if who.pod.name else who.container_id
        return f"{name} was allocated the device"

    def _back_off(self, uuid: str) -> None:
        """A failed or aborted try: the schedule tries again after RETRY_AFTER, doubling per
        failure in a row, never later than `interval` (it used to wait the whole interval)."""
        failures = self._retry.get(uuid, (0.0, 0))[1] + 1
        wait = min(RETRY_AFTER * 2 ** (failures - 1), max(self.settings.interval, RETRY_AFTER))
        self._retry[uuid] = (self.clock() + wait, failures)

    @staticmethod
    def _occupied(uuid: str, pids: set[int] | None) -> str | None:
        if not pids:
            return None
        listed = ", ".join(str(p) for p in sorted(pids)[:3])
        return f"process(es) {listed} outside HCS use the device"

    async def _one(self, uuid: str, *, scheduled: bool) -> Outcome:
        device = self.service.device(uuid)
        if device is None:
            # a mistake in the request, not a state of the device: failed (hcsctl exits 1)
            return self._outcome(Outcome(uuid, "failed", "no such device on this node"))
        label = f"{device.vendor.value}/{device.index} ({uuid})"
        why = (
            self._why_not(device, scheduled=scheduled)
            or self._taken(uuid)
            or self._occupied(uuid, await asyncio.to_thread(self.occupants, uuid))
        )
        if why is not None:
            log.debug("measure: %s: skipped: %s", label, why)
            return self._outcome(Outcome(uuid, "skipped", why))
        s = self.settings
        request = GemmRequest(
            vendor=device.vendor.value,
            size=s.size,
            duration=s.duration,
            warmup=s.warmup,
            compute=s.accumulate,
            bandwidth=s.copy_mib > 0,
            copy_bytes=s.copy_mib << 20,
            library_path=s.library_path,
            ascend_op_models=s.ascend_op_models,
        )
        self.current = uuid
        try:
            result = await self._run(
                device,
                request,
                timeout=s.timeout,
                interrupt=lambda: self._taken(uuid),
                worker_env=s.worker_env,
            )
            after = await asyncio.to_thread(self.occupants, uuid)
            if (used := self._occupied(uuid, after)) is not None:
                raise Interrupted(f"discarded: {used} while it was measured")
            measurement = self._measurement(device, result)
            await asyncio.to_thread(self.store.put, measurement)
        except Interrupted as e:
            log.warning("measure: %s: %s; no figure recorded", label, e)
            self._back_off(uuid)
            return self._outcome(Outcome(uuid, "aborted", str(e)))
        except BenchmarkError as e:
            log.warning("measure: %s: failed: %s; no figure recorded", label, e)
            self._back_off(uuid)
            if e.permanent and device.vendor not in self._broken:
                self._broken[device.vendor] = str(e)
            return self._outcome(Outcome(uuid, "failed", str(e)))
        except OSError as e:
            log.error("measure: %s: failed to record in %s: %s", label, self.store.path, e)
            self._back_off(uuid)
            return self._outcome(Outcome(uuid, "failed", f"failed to record: {e}"))
        finally:
            self.current = None
        self._broken.pop(device.vendor, None)
        self._last[uuid] = measurement.at
        self._retry.pop(uuid, None)
        self._stored[uuid] = measurement
        current = self.service.device(uuid)
        if current is not None:
            self.service.set_device(self._apply(current, measurement))
        log.info("measure: %s: %s", label, describe(measurement))
        return self._outcome(Outcome(uuid, "measured", describe(measurement), measurement))

    def _measurement(self, device: Device, result: dict[str, Any]) -> Measurement:
        profile = self.profiles.lookup(device.vendor, device.model)
        try:
            bandwidth = result.get("bandwidth_gbps")
            # rounded as the file keeps them, so a restart applies exactly the same figures
            return Measurement(
                uuid=device.uuid,
                tflops_fp16=round(float(result["tflops"]), 3),
                profile_tflops_fp16=profile.figure("tflops_fp16") if profile else 0.0,
                bandwidth_gbps=round(float(bandwidth), 1) if bandwidth else None,
                seconds=round(float(result["seconds"]), 6),
                iterations=int(result["iterations"]),
                size=int(result["size"]),
                library=str(result["library"]),
                at=self.clock(),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BenchmarkError(f"worker result without a usable figure: {e}") from e

    def _outcome(self, outcome: Outcome) -> Outcome:
        self.counts[outcome.status] += 1
        if self.telemetry is not None:
            self.telemetry.measurements.labels(outcome.status).inc()
        return outcome


def build_measurer(
    config: Config,
    service: NodeService,
    backends: Sequence[DiscoveryBackend],
    telemetry: Telemetry | None = None,
) -> Measurer:
    """The daemon's measurer: `[measure]`, its file (default: in the state directory), the
    vendors whose real backend runs, and the measurements on file applied to the devices."""
    settings = config.measure
    path = settings.file or os.path.join(config.daemon.state_dir, "measured.json")
    vendors = [Vendor(b.name) for b in backends if b.name in VENDOR_BACKENDS]
    devices = [status.device for status in service.devices()]
    occupants = DeviceProcesses.for_devices(devices, config.discovery)
    measurer = Measurer(
        service,
        settings,
        MeasuredStore(path),
        vendors=vendors,
        telemetry=telemetry,
        occupants=occupants.pids,
    )
    measurer.restore()
    return measurer


def describe(m: Measurement) -> str:
    """`301.2 FP16 TFLOPS (0.97 of the profile's 312), 1650.0 GB/s; 48 GEMMs of 8192^3 in 1.00 s
    through libcublas.so.12`."""
    text = f"{m.tflops_fp16:.1f} FP16 TFLOPS"
    if m.ratio is not None:
        text += f" ({m.ratio:.2f} of the profile's {m.profile_tflops_fp16:g})"
    else:
        text += " (no profile figure to compare)"
    if m.bandwidth_gbps is not None:
        text += f", {m.bandwidth_gbps:.1f} GB/s"
    return text + f"; {m.iterations} GEMMs of {m.size}^3 in {m.seconds:.2f} s through {m.library}"
