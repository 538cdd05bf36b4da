"""Huawei Ascend NPUs through DCMI (`libdcmi.so` via ctypes), or `npu-smi info` where DCMI is
missing.

DCMI gives per chip: card and device ids, logic id (the N of /dev/davinciN), chip name, HBM
total and used (DDR on 310P), health, current error codes, ECC counts and the topology between
chips (HCCS, PCIe levels). npu-smi gives names, health, bus ids and memory only, so the
fallback reports no links and no counters.
"""

from __future__ import annotations

import ctypes
import itertools
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

__all__ = ["AscendBackend", "parse_npu_smi"]

log = logging.getLogger(__name__)

SHARED_NODES = ("davinci_manager", "devmm_svm", "hisi_hdc")
MiB = 2**20
# dcmi_get_device_health: 0 ok, 1 minor, 2 major, 3 critical; npu-smi prints the same as words.
_HEALTH = {0: HealthState.HEALTHY, 1: HealthState.DEGRADED}
# DCMI_TOPO_TYPE_*: SYS 1, PHB 2, HCCS 3, PXB 4, PIX 5, SIO 6, HCCS_SW 7.
_TOPO = {
    1: LinkKind.SYSTEM,
    2: LinkKind.PCIE_HOST,
    3: LinkKind.HCCS,
    4: LinkKind.PCIE_SWITCH,
    5: LinkKind.PCIE_SWITCH,
    6: LinkKind.HCCS,
    7: LinkKind.HCCS,
}
HCCS_GBPS = {"910B": 56.0, "910": 30.0}  # one link, one direction, by chip family


class _Chip(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_ubyte * 32),
        ("chip_name", ctypes.c_ubyte * 32),
        ("chip_ver", ctypes.c_ubyte * 32),
        ("aicore_cnt", ctypes.c_uint),
    ]


class _Hbm(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class _Memory(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("utiliza", ctypes.c_uint),
    ]


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


class _Ecc(ctypes.Structure):
    _fields_ = [
        ("enable_flag", ctypes.c_int),
        ("single_bit_error_cnt", ctypes.c_uint),
        ("double_bit_error_cnt", ctypes.c_uint),
        ("total_single_bit_error_cnt", ctypes.c_uint),
        ("total_double_bit_error_cnt", ctypes.c_uint),
        ("single_bit_isolated_pages_cnt", ctypes.c_uint),
        ("double_bit_isolated_pages_cnt", ctypes.c_uint),
    ]


class AscendBackend(DiscoveryBackend):
    name = "ascend"

    def __init__(
        self,
        settings: DiscoverySection,
    ) -> None:
        self.library, self.npu_smi = settings.dcmi_library, settings.npu_smi
        self.sysfs, self.dev_root = Path(settings.sysfs), Path(settings.dev_root)
        self._dcmi: Any = None
        self._chips: dict[str, tuple[int, int]] = {}  # uuid -> (card, device)
        self._gbps: dict[str, float] = {}  # bus -> PCIe GB/s, read once per discovery

    def discover(self) -> Sequence[Device]:
        try:
            self._dcmi = ctypes.CDLL(self.library)
        except OSError as e:
            log.info("ascend: DCMI unavailable (%s); reading npu-smi info instead", e)
            return self._from_npu_smi()
        self._check("initialise DCMI", self._dcmi.dcmi_init())
        chips = self._list_chips()
        devices = [self._device(card, dev) for card, dev in chips]
        return [
            replace(a, links=tuple(self._link(a, b) for b in devices if b.uuid != a.uuid))
            for a in devices
        ]

    def health_counters(self) -> dict[str, dict[str, int]]:
        counters = {}
        for uuid, (card, dev) in self._chips.items():
            values: dict[str, int] = {"device_errors": len(self._error_codes(card, dev))}
            ecc = _Ecc()
            if self._dcmi.dcmi_get_device_ecc_info(card, dev, 2, ctypes.byref(ecc)) == 0:  # HBM
                values["ecc_correctable"] = ecc.total_single_bit_error_cnt
                values["ecc_uncorrectable"] = ecc.total_double_bit_error_cnt
                values["retired_pages"] = ecc.double_bit_isolated_pages_cnt
            counters[uuid] = values
        return counters

    # -- DCMI --------------------------------------------------------------------------------

    def _check(self, step: str, code: int) -> None:
        if code != 0:
            raise DiscoveryError(f"failed to {step}: DCMI error {code}")

    def _list_chips(self) -> list[tuple[int, int]]:
        count, cards = ctypes.c_int(), (ctypes.c_int * 64)()
        self._check("list cards", self._dcmi.dcmi_get_card_num_list(ctypes.byref(count), cards, 64))
        chips = []
        for card in cards[: max(0, min(count.value, 64))]:
            per_card = ctypes.c_int()
            self._check(
                f"count chips on card {card}",
                self._dcmi.dcmi_get_device_num_in_card(card, ctypes.byref(per_card)),
            )
            chips += [(card, dev) for dev in range(max(0, min(per_card.value, 16)))]
        return chips

    def _device(self, card: int, dev: int) -> Device:
        where = f"card {card} chip {dev}"
        dcmi, logic, chip = self._dcmi, ctypes.c_int(), _Chip()
        self._check(
            f"read the logic id of {where}",
            dcmi.dcmi_get_device_logic_id(ctypes.byref(logic), card, dev),
        )
        self._check(
            f"read chip info of {where}",
            dcmi.dcmi_get_device_chip_info(card, dev, ctypes.byref(chip)),
        )
        name = bytes(chip.chip_name).split(b"\0")[0].decode("ascii", "replace").strip()
        hbm, memory = _Hbm(), _Memory()
        if dcmi.dcmi_get_device_hbm_info(card, dev, ctypes.byref(hbm)) == 0:
            total, used = hbm.memory_size * MiB, hbm.memory_usage * MiB
        else:  # 310P: no HBM, DDR instead
            self._check(
                f"read memory of {where}",
                dcmi.dcmi_get_device_memory_info_v2(card, dev, ctypes.byref(memory)),
            )
            total, used = memory.memory_size * MiB, 0
        health = ctypes.c_uint()
        self._check(
            f"read health of {where}", dcmi.dcmi_get_device_health(card, dev, ctypes.byref(health))
        )
        pcie = _Pcie()
        self._check(
            f"read PCIe info of {where}",
            dcmi.dcmi_get_device_pcie_info_v2(card, dev, ctypes.byref(pcie)),
        )
        bus = pci.normalise_address(
            f"{pcie.domain:04x}:{pcie.bdf_busid:02x}:{pcie.bdf_deviceid:02x}.{pcie.bdf_funcid}"
        )
        die = (ctypes.c_uint * 5)()
        uuid = f"NPU-{bus}"
        if dcmi.dcmi_get_device_die_v2(card, dev, 1, ctypes.byref(die)) == 0:  # VDIE
            uuid = "NPU-" + "-".join(f"{word:08x}" for word in die)
        self._chips[uuid] = (card, dev)
        codes = self._error_codes(card, dev)
        attributes = [("card_id", str(card)), ("chip_id", str(dev)), ("memory_used", str(used))]
        if codes:
            attributes.append(("error_codes", ",".join(f"0x{c:08X}" for c in codes)))
        return self._finish(
            uuid=uuid,
            name=name,
            index=logic.value,
            bus=bus,
            total=total,
            health=health.value,
            attributes=attributes,
        )

    def _error_codes(self, card: int, dev: int) -> list[int]:
        count, codes = ctypes.c_int(), (ctypes.c_uint * 128)()
        code = self._dcmi.dcmi_get_device_errorcode_v2(card, dev, ctypes.byref(count), codes, 128)
        return list(codes[: max(0, min(count.value, 128))]) if code == 0 else []

    def _link(self, a: Device, b: Device) -> Link:
        kind_code = ctypes.c_int(0)
        (card_a, dev_a), (card_b, dev_b) = self._chips[a.uuid], self._chips[b.uuid]
        self._check(
            f"read topology {a.uuid} - {b.uuid}",
            self._dcmi.dcmi_get_topo_info_by_device_id(
                card_a, dev_a, card_b, dev_b, ctypes.byref(kind_code)
            ),
        )
        kind = _TOPO.get(kind_code.value, LinkKind.SYSTEM)
        if kind is LinkKind.HCCS:
            family = "910B" if "910B" in a.model else "910"
            return Link(b.uuid, kind, HCCS_GBPS[family])
        return Link(
            b.uuid, kind, min(self._gbps.get(a.pci_bus_id, 0.0), self._gbps.get(b.pci_bus_id, 0.0))
        )

    # -- shared ------------------------------------------------------------------------------

    def _finish(
        self,
        *,
        uuid: str,
        name: str,
        index: int,
        bus: str,
        total: int,
        health: int,
        attributes: list[tuple[str, str]],
    ) -> Device:
        function = pci.read_function(self.sysfs, bus)
        self._gbps[bus] = function.link_gbps if function else 0.0
        state = _HEALTH.get(health, HealthState.UNHEALTHY)
        device = Device(
            uuid=uuid,
            vendor=Vendor.ASCEND,
            model=name,
            index=index,
            pci_bus_id=bus,
            vram_bytes=total,
            numa_node=function.numa_node if function else -1,
            device_nodes=(device_node(self.dev_root, f"davinci{index}"),),
            shared_nodes=existing_nodes(self.dev_root, SHARED_NODES),
            health_state=state,
            health_score=100 if state is HealthState.HEALTHY else 50 if state.schedulable else 0,
            attributes=(*attributes, *(function.attributes() if function else ())),
        )
        return fingerprint(Vendor.ASCEND, name).apply(device)

    def _from_npu_smi(self) -> list[Device]:
        text = run_tool([self.npu_smi, "info"])
        chips = parse_npu_smi(text)
        if not chips:
            raise DiscoveryError("npu-smi info listed no NPU: unexpected output format")
        return [
            self._finish(
                uuid=f"NPU-{c['bus']}",
                name=c["name"],
                index=i,
                bus=c["bus"],
                total=int(c["memory_mb"]) * MiB,
                health=0 if c["health"] == "ok" else 1 if c["health"] == "warning" else 2,
                attributes=[("card_id", c["npu"]), ("chip_id", c["chip"]), ("source", "npu-smi")],
            )
            for i, c in enumerate(chips)
        ]


_NAME_ROW = re.compile(r"^(?P<npu>\d+)\s+(?P<name>\S+)$")
_CHIP_ROW = re.compile(r"^(?P<chip>\d+)(?:\s+\d+)?$")
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


def parse_npu_smi(text: str) -> list[dict[str, str]]:
    """Chips from `npu-smi info`: pairs of table rows (NPU + name + health, then chip + bus id +
    usages, the last `used / total` being the chip's own memory: HBM, or DDR on 310P)."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    chips = []
    for first, second in itertools.pairwise(rows):
        if len(first) < 3 or len(second) < 3 or "Process" in first[0]:
            continue
        name, chip = _NAME_ROW.match(first[0]), _CHIP_ROW.match(second[0])
        usages = _USAGE.findall(second[2])
        if name is None or chip is None or not usages:
            continue
        try:
            bus = pci.normalise_address(second[1])
        except ValueError:
            continue
        chips.append(
            {
                "npu": name["npu"],
                "name": name["name"],
                "health": first[1].lower(),
                "chip": chip["chip"],
                "bus": bus,
                "memory_mb": usages[-1][1],
            }
        )
    return chips
