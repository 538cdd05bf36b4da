"""NVIDIA GPUs through NVML (`pynvml` from nvidia-ml-py), the driver's own management library.

What it reads per GPU: uuid, name, memory, PCI bus id, minor number (for /dev/nvidiaN), compute
capability, max clocks, power limit, MIG mode; per pair: NVLink (direct or through NVSwitch),
else peer-to-peer status and the PCIe topology level. NUMA node and PCIe link come from sysfs.
Health counters (ECC, retired pages, row remapping, PCIe replays, NVLink recovery errors) and
the sub-health readings (clock event reasons, SM clock against its maximum, pending page
retirement or row remapping) are re-read on every poll from handles kept since discovery.

MIG is reported (`mig_mode` attribute) and the GPU is still offered whole: HCS does not split
MIG instances, and a MIG-enabled GPU must not break discovery.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml

from hcsd.discovery import pci
from hcsd.discovery.backend import DiscoveryBackend, DiscoveryError
from hcsd.discovery.nodes import device_node, existing_nodes
from hcsd.discovery.settings import DiscoverySection
from hcsd.model import Device, Link, LinkKind, Vendor
from hcsd.profiles.fingerprint import fingerprint

__all__ = ["NvidiaBackend"]

log = logging.getLogger(__name__)

SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
MAX_LINKS = 18  # NVLink 4 has 18 per GPU; NVML answers INVALID_ARGUMENT past the last one
LINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}  # per link, one direction
_UNSUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
#: GPU utilization (percent of the last sample period a kernel ran) from which a GPU is busy:
#: its link and clocks are then judged (idle GPUs lower both on purpose).
BUSY_PERCENT = 50
_LEVEL_KIND = [(20, LinkKind.PCIE_SWITCH), (40, LinkKind.PCIE_HOST)]  # NVML_TOPOLOGY_*


class NvidiaBackend(DiscoveryBackend):
    name = "nvidia"

    def __init__(
        self,
        settings: DiscoverySection,
    ) -> None:
        self.library = settings.nvml_library  # empty: the loader's search path
        self.sysfs = Path(settings.sysfs)
        self.dev_root = Path(settings.dev_root)
        self._handles: dict[str, Any] = {}
        self._active_links: dict[str, list[int]] = {}
        self._unsupported: dict[str, set[str]] = {}  # uuid -> values answered NOT_SUPPORTED
        self._failing: set[tuple[str, str]] = set()  # (uuid, value) warned about
        self._rows: dict[str, tuple[int, int, int, int]] = {}  # this poll's remapped rows
        self._max_clock: dict[str, int] = {}
        self._gbps: dict[str, float] = {}  # bus -> PCIe GB/s, read once per discovery
        self._open = False

    def discover(self) -> Sequence[Device]:
        self._init()
        count = _call("count devices", pynvml.nvmlDeviceGetCount)
        driver = _text(_call("read the driver version", pynvml.nvmlSystemGetDriverVersion))
        handles = [_call("open GPU", pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        base = [self._device(i, h, driver) for i, h in enumerate(handles)]
        gpu_buses = {d.pci_bus_id for d in base}
        remote = {d.uuid: self._nvlinks(d.uuid, h) for d, h in zip(base, handles, strict=True)}
        # Links to buses that are not GPUs go to NVSwitches, which join every GPU behind them.
        switched = {
            uuid: sum(g for bus, g in peers.items() if bus not in gpu_buses)
            for uuid, peers in remote.items()
        }
        devices = []
        for a, handle_a in zip(base, handles, strict=True):
            links = tuple(
                _nvlink(a, b, remote, switched) or self._pcie_link(a, b, handle_a, handle_b)
                for b, handle_b in zip(base, handles, strict=True)
                if b.uuid != a.uuid
            )
            devices.append(_with(a, links=links))
        return devices

    def health_counters(self) -> dict[str, dict[str, int]]:
        counters: dict[str, dict[str, int]] = {}
        self._rows.clear()  # read once per poll, shared with the readings below
        for uuid, handle in list(self._handles.items()):  # hot-plug may add one meanwhile
            counters[uuid] = self._read_each(uuid, handle, self._counter_readers(uuid), "counter")
        return counters

    def health_gauges(self) -> dict[str, dict[str, int]]:
        gauges: dict[str, dict[str, int]] = {}
        for uuid, handle in list(self._handles.items()):
            readers = dict(_GAUGES)
            readers["row_remap_pending"] = functools.partial(self._remap_pending, uuid)
            readers["sm_clock_max_mhz"] = functools.partial(self._max_sm_clock, uuid)
            values = self._read_each(uuid, handle, readers, "reading")
            if "utilization_percent" in values:
                values["busy"] = int(values.pop("utilization_percent") >= BUSY_PERCENT)
            gauges[uuid] = values
        self._rows.clear()  # the next poll reads them again
        return gauges

    def close(self) -> None:
        if self._open:
            self._open = False
            self._handles.clear()
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as e:
                log.debug("nvidia: shutdown: %s", e)

    # -- discovery steps ---------------------------------------------------------------------

    def _init(self) -> None:
        if self._open:
            return
        if self.library:
            with pynvml.libLoadLock:  # pynvml keeps one library per process
                loaded = getattr(pynvml.nvmlLib, "_name", None)
                if loaded is not None and loaded != self.library:
                    raise DiscoveryError(
                        f"failed to load NVML from {self.library}: {loaded} is already loaded"
                    )
                if loaded is None:
                    try:
                        pynvml.nvmlLib = ctypes.CDLL(self.library)
                    except OSError as e:
                        raise DiscoveryError(f"failed to load NVML from {self.library}: {e}") from e
        _call("initialise NVML (is the NVIDIA driver loaded?)", pynvml.nvmlInit)
        self._open = True

    def _device(self, index: int, handle: Any, driver: str) -> Device:
        uuid = _text(_call("read the uuid", pynvml.nvmlDeviceGetUUID, handle))
        name = _text(_call(f"read the name of {uuid}", pynvml.nvmlDeviceGetName, handle))
        memory = _call(f"read the memory of {uuid}", pynvml.nvmlDeviceGetMemoryInfo, handle)
        pci_info = _call(f"read the PCI info of {uuid}", pynvml.nvmlDeviceGetPciInfo, handle)
        bus = pci.normalise_address(_text(pci_info.busId))
        minor = _call(f"read the minor number of {uuid}", pynvml.nvmlDeviceGetMinorNumber, handle)
        major, cc_minor = _optional(pynvml.nvmlDeviceGetCudaComputeCapability, handle) or (0, 0)
        function = pci.read_function(self.sysfs, bus)
        self._gbps[bus] = function.link_gbps if function else 0.0
        attributes = [("compute_capability", f"{major}.{cc_minor}"), ("driver_version", driver)]
        for label, clock in (("max_sm_clock_mhz", 1), ("max_mem_clock_mhz", 2)):
            if (value := _optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, clock)) is not None:
                attributes.append((label, str(value)))
                if clock == 1:
                    self._max_clock[uuid] = int(value)
        if (limit := _optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)) is not None:
            attributes.append(("power_limit_w", f"{limit / 1000:g}"))
        if (mig := _optional(pynvml.nvmlDeviceGetMigMode, handle)) is not None:
            attributes.append(("mig_mode", "enabled" if mig[0] else "disabled"))
            if mig[0]:
                log.info("nvidia: MIG is enabled on %s; HCS offers it as one whole GPU", uuid)
        self._handles[uuid] = handle
        device = Device(
            uuid=uuid,
            vendor=Vendor.NVIDIA,
            model=name,
            index=index,
            pci_bus_id=bus,
            vram_bytes=int(memory.total),
            numa_node=function.numa_node if function else -1,
            device_nodes=(device_node(self.dev_root, f"nvidia{minor}"),),
            shared_nodes=existing_nodes(self.dev_root, SHARED_NODES),
            attributes=(
                *attributes,
                *(function.attributes() if function else ()),
            ),
        )
        return fingerprint(Vendor.NVIDIA, name).apply(device)

    def _nvlinks(self, uuid: str, handle: Any) -> dict[str, float]:
        """GB/s of active NVLinks by remote bus id (GPUs or NVSwitches)."""
        remote: dict[str, float] = {}
        active = []
        for link in range(MAX_LINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                version = pynvml.nvmlDeviceGetNvLinkVersion(handle, link)
                peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except pynvml.NVMLError:
                break  # not supported on this board, or past the last link
            bus = pci.normalise_address(_text(peer.busId))
            remote[bus] = remote.get(bus, 0.0) + LINK_GBPS.get(int(version), 25.0)
            active.append(link)
        self._active_links[uuid] = active
        return remote

    def _pcie_link(self, a: Device, b: Device, handle_a: Any, handle_b: Any) -> Link:
        level = _optional(pynvml.nvmlDeviceGetTopologyCommonAncestor, handle_a, handle_b)
        status = _optional(pynvml.nvmlDeviceGetP2PStatus, handle_a, handle_b, 0)  # caps: read
        kind = LinkKind.SYSTEM
        if level is not None:
            kind = next((k for limit, k in _LEVEL_KIND if level <= limit), LinkKind.SYSTEM)
        if kind is LinkKind.PCIE_SWITCH and status != 0:  # NVML_P2P_STATUS_OK
            kind = LinkKind.PCIE_HOST
        return Link(b.uuid, kind, self._pcie_gbps(a, b))

    def _pcie_gbps(self, a: Device, b: Device) -> float:
        return min(self._gbps.get(a.pci_bus_id, 0.0), self._gbps.get(b.pci_bus_id, 0.0))

    def _counter_readers(self, uuid: str) -> dict[str, Callable[[Any], int]]:
        readers = _readers(self._active_links.get(uuid, []))
        readers["row_remap_failures"] = lambda h: self._remap(uuid, h)[3]
        readers["remapped_rows_correctable"] = lambda h: self._remap(uuid, h)[0]
        return readers

    def _remap(self, uuid: str, handle: Any) -> tuple[int, int, int, int]:
        """nvmlDeviceGetRemappedRows (corrected, uncorrected, pending, failed), once a poll."""
        if uuid not in self._rows:
            corrected, uncorrected, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
            self._rows[uuid] = (int(corrected), int(uncorrected), int(pending), int(failed))
        return self._rows[uuid]

    def _remap_pending(self, uuid: str, handle: Any) -> int:
        return self._remap(uuid, handle)[2]

    def _max_sm_clock(self, uuid: str, handle: Any) -> int:
        """The maximum SM clock does not change: read once (discovery records it as well)."""
        if uuid not in self._max_clock:
            self._max_clock[uuid] = int(
                pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            )
        return self._max_clock[uuid]

    def _read_each(
        self, uuid: str, handle: Any, readers: dict[str, Callable[[Any], int]], what: str
    ) -> dict[str, int]:
        """Each value the GPU supports, each on its own: one that fails is left out (warned
        about once per device and value), the others still count. What answered NOT_SUPPORTED
        once is not asked again (Ampere answers so for retired pages on every call, and
        exceptions cost)."""
        unsupported = self._unsupported.setdefault(uuid, set())
        values: dict[str, int] = {}
        for name, read in readers.items():
            if name in unsupported:
                continue
            try:
                values[name] = read(handle)
            except pynvml.NVMLError as e:
                if e.value in _UNSUPPORTED:
                    unsupported.add(name)
                elif (uuid, name) not in self._failing:
                    self._failing.add((uuid, name))
                    log.warning("nvidia: %s %s of %s unavailable: %s", what, name, uuid, e)
                continue
            self._failing.discard((uuid, name))
        return values


def _clock_event_reasons(handle: Any) -> int:
    """nvmlDeviceGetCurrentClocksEventReasons (driver 535 on), else its older name, which
    newer drivers keep as a deprecated alias with the same bits."""
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError as e:
        if e.value != 13:  # NVML_ERROR_FUNCTION_NOT_FOUND: a driver older than the name
            raise
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


_GAUGES: dict[str, Callable[[Any], int]] = {
    "clock_event_reasons": _clock_event_reasons,
    "sm_clock_mhz": lambda h: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
    "sm_clock_applications_mhz": lambda h: int(
        pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_SM)
    ),
    # busy from the utilization (nvml.h may drop the GpuIdle reason bit)
    "utilization_percent": lambda h: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
    "retired_pages_pending": lambda h: int(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
}


def _nvlink(
    a: Device, b: Device, remote: dict[str, dict[str, float]], switched: dict[str, float]
) -> Link | None:
    if direct := remote[a.uuid].get(b.pci_bus_id, 0.0):
        return Link(b.uuid, LinkKind.NVLINK, direct)
    if switched[a.uuid] and switched[b.uuid]:
        return Link(b.uuid, LinkKind.NVLINK, min(switched[a.uuid], switched[b.uuid]))
    return None


def _retired_count(handle: Any, cause: int) -> int:
    return len(pynvml.nvmlDeviceGetRetiredPages(handle, cause))


def _readers(links: Sequence[int]) -> dict[str, Callable[[Any], int]]:
    """Health counters by the names the health watcher knows. ECC counts are volatile ones:
    monotonic while the driver stays loaded, which is what the watcher compares."""
    readers: dict[str, Callable[[Any], int]] = {
        "ecc_correctable": lambda h: int(pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0)),
        "ecc_uncorrectable": lambda h: int(pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
        "retired_pages": lambda h: _retired_count(h, 0) + _retired_count(h, 1),
        "pcie_replays": lambda h: int(pynvml.nvmlDeviceGetPcieReplayCounter(h)),
    }
    if links:  # NVML_NVLINK_ERROR_DL_RECOVERY on every active link
        readers["link_errors"] = lambda h: sum(
            int(pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, 1)) for link in links
        )
    return readers


def _with(device: Device, *, links: tuple[Link, ...]) -> Device:
    return replace(device, links=links)


def _call(step: str, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except pynvml.NVMLError as e:
        raise DiscoveryError(f"failed to {step}: {e}") from e


def _optional(function: Callable[..., Any], *args: Any) -> Any:
    """A value the GPU may not support (NOT_SUPPORTED and the like answer None)."""
    try:
        return function(*args)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
