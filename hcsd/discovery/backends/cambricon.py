"""Cambricon MLUs through CNDev (`libcndev.so` via ctypes), or `cnmon info` where CNDev is missing.

CNDev gives per card: uuid, name, physical memory, PCI location, health, ECC counts,
MLU-Link ports with the uuid of the card at the other end, and (newer CNDev) throttle reasons
and a pending page retirement for the sub-health signals. Every CNDev structure starts with
`int version`, which the caller sets (CNDEV_VERSION_5 here); buffers are sized to the largest
known layout so that a library filling a newer version does not write past them. cnmon gives
names, uuids, PCI location and memory only: no links, no counters.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hcsd.discovery import pci
from hcsd.discovery.backend import DiscoveryBackend, DiscoveryError
from hcsd.discovery.nodes import device_node, existing_nodes
from hcsd.discovery.settings import DiscoverySection
from hcsd.discovery.tools import run_tool
from hcsd.model import Device, HealthState, Link, LinkKind, Vendor
from hcsd.profiles.fingerprint import fingerprint

__all__ = ["CambriconBackend", "parse_cnmon"]

log = logging.getLogger(__name__)

VERSION = 5  # CNDEV_VERSION_5
_NOT_SUPPORTED = 10  # CNDEV_ERROR_NOT_SUPPORTED
SHARED_NODES = ("cambricon_ctl", "cambricon_gdr")
PER_DEVICE_OPTIONAL = (
    "cambricon_ipcm{}",
    "cambr-msgq:{}",
    "cambr-rpc:{}",
    "cmsg_ctrl{}",
    "commu{}",
)
MLULINK_PORT_GBPS = 25.0  # one port, one direction (approximate; CNDev reports no bandwidth)
MiB = 2**20


def _struct(*fields: tuple[str, Any]) -> type[ctypes.Structure]:
    """A versioned CNDev structure with room to spare for newer layouts."""
    return type(
        "S",
        (ctypes.Structure,),
        {"_fields_": [("version", ctypes.c_int), *fields, ("_spare", ctypes.c_ubyte * 512)]},
    )


_Count = _struct(("number", ctypes.c_uint))
_Uuid = _struct(("uuid", ctypes.c_ubyte * 37), ("ncs", ctypes.c_uint64))
_Memory = _struct(("total", ctypes.c_int64), ("used", ctypes.c_int64))
_Pcie = _struct(
    ("subsystem_id", ctypes.c_uint),
    ("device_id", ctypes.c_uint),
    ("vendor", ctypes.c_uint16),
    ("subsystem_vendor", ctypes.c_uint16),
    ("domain", ctypes.c_uint),
    ("bus", ctypes.c_uint),
    ("device", ctypes.c_uint),
    ("function", ctypes.c_uint),
)
_Health = _struct(("health", ctypes.c_int))
_Ecc = _struct(
    *(
        (name, ctypes.c_uint64)
        for name in (
            "one_bit",
            "multiple_one",
            "multiple",
            "multiple_multiple",
            "corrected",
            "uncorrected",
            "total",
            "address_forbidden",
        )
    )
)
# cndev.h's cndevPerformanceThrottleReason_t (cndevEnableStatusEnum_t fields, ENABLED = 1) and
# cndevRetiredPageStatus_t, asked with API version 6 as Cambricon's own exporter does.
_THROTTLE_VERSION = 6  # CNDEV_VERSION_6
_Throttle = _struct(
    *(
        (name, ctypes.c_int)
        for name in ("tdp", "power_setting", "clock_setting", "locked", "power_brake", "thermal")
    )
)
_RetiredStatus = _struct(("pending", ctypes.c_uint32), ("failure", ctypes.c_uint32))
# CNDev's throttle reasons in NVML's clock-event bits, the vocabulary the sub-health signals
# read (hcsd/health/signals.py): TDP and power capping are the power cap (normal under load),
# a set or locked frequency the application clocks; the power brake and thermal slowdown are
# the board holding the MLU down.
_THROTTLE_BITS = (
    ("tdp", 0x4),
    ("power_setting", 0x4),
    ("clock_setting", 0x2),
    ("locked", 0x2),
    ("power_brake", 0x80),
    ("thermal", 0x40),
)
_LinkStatus = _struct(("active", ctypes.c_int), ("serdes", ctypes.c_int))
_Remote = _struct(
    ("mc_sn", ctypes.c_int64),
    ("ba_sn", ctypes.c_int64),
    ("slot", ctypes.c_uint32),
    ("port", ctypes.c_uint32),
    ("ip", ctypes.c_ubyte * 16),
    ("uuid", ctypes.c_ubyte * 37),
)


class CambriconBackend(DiscoveryBackend):
    name = "cambricon"

    def __init__(
        self,
        settings: DiscoverySection,
    ) -> None:
        self.library, self.cnmon = settings.cndev_library, settings.cnmon
        self.sysfs, self.dev_root = Path(settings.sysfs), Path(settings.dev_root)
        self._lib: Any = None
        self._handles: dict[str, int] = {}
        self._retired: dict[str, Any] = {}  # this poll's retired-page status per uuid
        self._unsupported: set[tuple[str, str]] = set()  # (uuid, call) answered NOT_SUPPORTED

    def discover(self) -> Sequence[Device]:
        try:
            self._lib = ctypes.CDLL(self.library)
        except OSError as e:
            log.info("cambricon: CNDev unavailable (%s); reading cnmon info instead", e)
            return self._from_cnmon()
        self._lib.cndevGetCardNameStringByDevId.restype = ctypes.c_char_p
        self._check("initialise CNDev", self._lib.cndevInit(0))
        count = _Count(version=VERSION)
        self._check("count MLUs", self._lib.cndevGetDeviceCount(ctypes.byref(count)))
        devices = [self._device(i, self._handle(i)) for i in range(min(count.number, 64))]
        by_uuid = {d.uuid for d in devices}
        return [replace(d, links=self._links(d, by_uuid)) for d in devices]

    def health_counters(self) -> dict[str, dict[str, int]]:
        """ECC counts, and a failed page retirement (CNDev's `isFailure`, 0 or 1) as the
        counter `retirement_failures`: memory that could not be retired, fatal as a failed
        row remap is."""
        counters: dict[str, dict[str, int]] = {}
        self._retired.clear()  # read once per poll, shared with the readings below
        for uuid, handle in list(self._handles.items()):
            values: dict[str, int] = {}
            ecc = _Ecc(version=VERSION)
            if self._lib.cndevGetECCInfo(ctypes.byref(ecc), handle) == 0:
                values["ecc_correctable"] = int(ecc.corrected)
                values["ecc_uncorrectable"] = int(ecc.uncorrected)
            if (status := self._retired_status(uuid, handle)) is not None:
                values["retirement_failures"] = int(bool(status.failure))
            if values:
                counters[uuid] = values
        return counters

    def health_gauges(self) -> dict[str, dict[str, int]]:
        """Throttle reasons and a pending page retirement, where this CNDev has the calls (a
        call that answers NOT_SUPPORTED for a card is not asked again). CNDev says nothing of
        idleness, so no `busy` reading: the PCIe link speed of an MLU is not judged
        (docs/health.md)."""
        lib, gauges = self._lib, {}
        if lib is None:
            return {}
        throttle = getattr(lib, "cndevGetPerformanceThrottleReason", None)
        for uuid, handle in list(self._handles.items()):
            values: dict[str, int] = {}
            reason = _Throttle(version=_THROTTLE_VERSION)
            if throttle is not None and self._ask(uuid, "throttle", throttle, reason, handle):
                bits = 0
                for name, bit in _THROTTLE_BITS:
                    bits |= bit if getattr(reason, name) == 1 else 0
                values["clock_event_reasons"] = bits
            if (status := self._retired_status(uuid, handle)) is not None:
                values["retired_pages_pending"] = int(bool(status.pending))
            if values:
                gauges[uuid] = values
        self._retired.clear()
        return gauges

    def _retired_status(self, uuid: str, handle: int) -> Any:
        """cndevGetRetiredPagesStatus, once a poll; None where the call is missing or failed."""
        if uuid not in self._retired:
            call = getattr(self._lib, "cndevGetRetiredPagesStatus", None)
            status = _RetiredStatus(version=_THROTTLE_VERSION)
            ok = call is not None and self._ask(uuid, "retired", call, status, handle)
            self._retired[uuid] = status if ok else None
        return self._retired[uuid]

    def _ask(self, uuid: str, name: str, call: Any, out: Any, handle: int) -> bool:
        """A CNDev query into `out`; False on an error. NOT_SUPPORTED is remembered."""
        if (uuid, name) in self._unsupported:
            return False
        code = call(ctypes.byref(out), handle)
        if code == _NOT_SUPPORTED:
            self._unsupported.add((uuid, name))
        return bool(code == 0)

    def close(self) -> None:
        if self._lib is not None:
            self._lib.cndevRelease()
            self._lib = None

    def _check(self, step: str, code: int) -> None:
        if code != 0:
            message = b""
            if self._lib is not None and hasattr(self._lib, "cndevGetErrorString"):
                self._lib.cndevGetErrorString.restype = ctypes.c_char_p
                message = self._lib.cndevGetErrorString(code) or b""
            raise DiscoveryError(f"failed to {step}: CNDev error {code} {message.decode()}".strip())

    def _handle(self, index: int) -> int:
        """Newer CNDev takes handles from cndevGetDeviceHandleByIndex; older takes the index."""
        if not hasattr(self._lib, "cndevGetDeviceHandleByIndex"):
            return index
        handle = ctypes.c_int()
        self._check(
            f"open MLU {index}", self._lib.cndevGetDeviceHandleByIndex(index, ctypes.byref(handle))
        )
        return handle.value

    def _device(self, index: int, handle: int) -> Device:
        lib = self._lib
        uuid_info, memory, pcie = (
            _Uuid(version=VERSION),
            _Memory(version=VERSION),
            _Pcie(version=VERSION),
        )
        self._check(
            f"read the uuid of MLU {index}", lib.cndevGetUUID(ctypes.byref(uuid_info), handle)
        )
        self._check(
            f"read memory of MLU {index}", lib.cndevGetMemoryUsage(ctypes.byref(memory), handle)
        )
        self._check(
            f"read PCIe info of MLU {index}", lib.cndevGetPCIeInfo(ctypes.byref(pcie), handle)
        )
        name = (lib.cndevGetCardNameStringByDevId(handle) or b"").decode("ascii", "replace")
        bus = pci.normalise_address(
            f"{pcie.domain:04x}:{pcie.bus:02x}:{pcie.device:02x}.{pcie.function}"
        )
        uuid = _uuid(_text(uuid_info.uuid)) or f"MLU-{bus}"
        health = _Health(version=VERSION)
        healthy = (
            lib.cndevGetCardHealthState(ctypes.byref(health), handle) != 0 or health.health == 1
        )
        self._handles[uuid] = handle
        return self._finish(
            uuid=uuid,
            name=name,
            index=index,
            bus=bus,
            total=int(memory.total) * MiB,
            healthy=healthy,
            source="cndev",
        )

    def _links(self, device: Device, known: set[str]) -> tuple[Link, ...]:
        handle = self._handles[device.uuid]
        ports: dict[str, int] = {}
        for port in range(max(0, min(int(self._lib.cndevGetMLULinkPortNumber(handle)), 32))):
            status, remote = _LinkStatus(version=VERSION), _Remote(version=VERSION)
            if (
                self._lib.cndevGetMLULinkStatus(ctypes.byref(status), handle, port)
                or not status.active
            ):
                continue
            if self._lib.cndevGetMLULinkRemoteInfo(ctypes.byref(remote), handle, port) == 0:
                peer = _uuid(_text(remote.uuid))
                if peer in known and peer != device.uuid:
                    ports[peer] = ports.get(peer, 0) + 1
        links = [Link(peer, LinkKind.MLULINK, n * MLULINK_PORT_GBPS) for peer, n in ports.items()]
        for peer in sorted(known - set(ports) - {device.uuid}):
            links.append(Link(peer, LinkKind.PCIE_HOST, 0.0))
        return tuple(links)

    def _finish(
        self, *, uuid: str, name: str, index: int, bus: str, total: int, healthy: bool, source: str
    ) -> Device:
        function = pci.read_function(self.sysfs, bus)
        optional = [pattern.format(index) for pattern in PER_DEVICE_OPTIONAL]
        device = Device(
            uuid=uuid,
            vendor=Vendor.CAMBRICON,
            model=name,
            index=index,
            pci_bus_id=bus,
            vram_bytes=total,
            numa_node=function.numa_node if function else -1,
            device_nodes=(
                device_node(self.dev_root, f"cambricon_dev{index}"),
                *existing_nodes(self.dev_root, optional),
            ),
            shared_nodes=existing_nodes(self.dev_root, SHARED_NODES),
            health_state=HealthState.HEALTHY if healthy else HealthState.UNHEALTHY,
            health_score=100 if healthy else 0,
            attributes=(("source", source), *(function.attributes() if function else ())),
        )
        return fingerprint(Vendor.CAMBRICON, name).apply(device)

    def _from_cnmon(self) -> list[Device]:
        cards = parse_cnmon(run_tool([self.cnmon, "info"]))
        if not cards:
            raise DiscoveryError("cnmon info listed no MLU: unexpected output format")
        return [
            self._finish(
                uuid=_uuid(c["uuid"]) or f"MLU-{c['bus']}",
                name=c["name"],
                index=i,
                bus=c["bus"],
                total=c["memory_mib"] * MiB,
                healthy=True,
                source="cnmon",
            )
            for i, c in enumerate(cards)
        ]


_CARD = re.compile(r"^Card\s+(\d+)\s*$")
_PAIR = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def parse_cnmon(text: str) -> list[dict[str, Any]]:
    """Cards from `cnmon info`: blocks headed `Card N`, `key : value` lines, indented lines
    belonging to the section named by the last unindented line without a value."""
    cards: list[dict[str, Any]] = []
    fields: dict[str, str] = {}
    section = ""

    def flush() -> None:
        try:
            bus = pci.normalise_address(
                "{}:{}:{}.{}".format(
                    int(fields.get("pcie info/domain id", "0"), 0),
                    f"{int(fields['pcie info/bus num'], 0):02x}",
                    f"{int(fields.get('pcie info/device', '0'), 0):02x}",
                    int(fields.get("pcie info/function", "0"), 0),
                )
            )
            memory = int(fields["physical memory usage/total"].split()[0])
        except (KeyError, ValueError, IndexError):
            return  # a block without location or memory is not a card we can offer
        cards.append(
            {
                "name": fields.get("product name", ""),
                "uuid": fields.get("uuid", ""),
                "bus": bus,
                "memory_mib": memory,
            }
        )

    for line in text.splitlines():
        if _CARD.match(line):
            if fields:
                flush()
            fields, section = {}, ""
            continue
        match = _PAIR.match(line)
        if match is None:
            if line.strip() and not line.startswith((" ", "\t")):
                section = line.strip().lower()
            continue
        indent, key, value = match.groups()
        key = key.strip().lower()
        fields[f"{section}/{key}" if indent and section else key] = value
        if not indent:
            section = ""
    if fields:
        flush()
    return cards


def _uuid(raw: str) -> str:
    """`MLU-<uuid>` whether the source prints the prefix (cnmon) or not (CNDev's 36 chars)."""
    return raw if not raw or raw.upper().startswith("MLU-") else f"MLU-{raw}"


def _text(raw: Any) -> str:
    return bytes(raw).split(b"\0")[0].decode("ascii", "replace").strip()
