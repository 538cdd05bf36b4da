"""Hygon DCUs from the KFD topology in sysfs, amdgpu's VRAM figures and, where present, hy-smi.

KFD (`class/kfd/kfd/topology/nodes/N`) lists GPU nodes in the order HIP numbers them, with
their PCI location, DRM render minor, unique id and xGMI links (`io_links`, type 11). amdgpu's
`mem_info_vram_total` gives VRAM; its RAS counters (`ras/umc_err_count`) give ECC errors. KFD
names only the ISA (gfx928), so the marketing model (K100_AI) comes from `hy-smi
--showproductname --showbus`; without hy-smi the model is unknown and reported as such.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hcsd.discovery import pci
from hcsd.discovery.backend import DiscoveryBackend, DiscoveryError
from hcsd.discovery.nodes import device_node, existing_nodes
from hcsd.discovery.settings import DiscoverySection
from hcsd.discovery.tools import run_tool
from hcsd.model import Device, Link, LinkKind, Vendor
from hcsd.profiles.fingerprint import fingerprint

__all__ = ["HygonBackend", "parse_hy_smi", "parse_properties"]

log = logging.getLogger(__name__)

SHARED_NODES = ("kfd", "mkfd")
XGMI_LINK_TYPE = 11  # CRAT_IOLINK_TYPE_XGMI
_DCU_LINE = re.compile(r"^DCU\[(\d+)\]\s*:\s*([^:]+):\s*(.*)$")


@dataclass(frozen=True, slots=True)
class _KfdNode:
    node_id: int
    properties: Mapping[str, int]
    isa: str
    links: tuple[tuple[int, int, int], ...]  # (type, node_to, max_bandwidth MB/s)

    @property
    def bus(self) -> str:
        location = self.properties.get("location_id", 0)
        return pci.normalise_address(
            f"{self.properties.get('domain', 0):04x}:{location >> 8:02x}:"
            f"{(location & 0xFF) >> 3:02x}.{location & 0x7}"
        )


class HygonBackend(DiscoveryBackend):
    name = "hygon"

    def __init__(
        self,
        settings: DiscoverySection,
    ) -> None:
        self.hy_smi = settings.hy_smi
        self.sysfs, self.dev_root = Path(settings.sysfs), Path(settings.dev_root)
        self._buses: dict[str, str] = {}  # uuid -> bus
        self._gbps: dict[str, float] = {}  # bus -> PCIe GB/s, read once per discovery

    def discover(self) -> Sequence[Device]:
        nodes = [n for n in self._kfd_nodes() if n.properties.get("vendor_id") == 0x1D94]
        names = self._product_names()
        devices = [self._device(i, node, names) for i, node in enumerate(nodes)]
        uuid_of = {node.node_id: d.uuid for node, d in zip(nodes, devices, strict=True)}
        return [
            replace(device, links=self._links(node, device, devices, uuid_of))
            for node, device in zip(nodes, devices, strict=True)
        ]

    def health_counters(self) -> dict[str, dict[str, int]]:
        counters = {}
        for uuid, bus in self._buses.items():
            path = self.sysfs / "bus" / "pci" / "devices" / bus / "ras" / "umc_err_count"
            try:
                values = parse_properties(path.read_text().replace(":", " "))
            except (OSError, ValueError):
                continue
            counters[uuid] = {
                "ecc_uncorrectable": values.get("ue", 0),
                "ecc_correctable": values.get("ce", 0),
            }
        return counters

    def _kfd_nodes(self) -> list[_KfdNode]:
        root = self.sysfs / "class" / "kfd" / "kfd" / "topology" / "nodes"
        if not root.is_dir():
            raise DiscoveryError(f"no KFD topology at {root}: is the DCU driver (hydcu) loaded?")
        nodes = []
        for path in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            if not path.name.isdigit():
                continue
            try:
                properties = parse_properties((path / "properties").read_text())
            except (OSError, ValueError) as e:
                raise DiscoveryError(f"failed to read KFD node {path}: {e}") from e
            if not properties.get("simd_count"):
                continue  # a CPU node
            links = []
            for link in sorted((path / "io_links").glob("*/properties")):
                values = parse_properties(link.read_text())
                links.append(
                    (
                        values.get("type", 0),
                        values.get("node_to", -1),
                        values.get("max_bandwidth", 0),
                    )
                )
            isa = (path / "name").read_text().strip() if (path / "name").exists() else ""
            nodes.append(_KfdNode(int(path.name), properties, isa, tuple(links)))
        return nodes

    def _product_names(self) -> dict[str, str]:
        """Bus id -> product name from hy-smi; empty when hy-smi is not installed."""
        if not os.path.exists(self.hy_smi):
            log.info("hygon: %s not found; DCU models come from KFD only", self.hy_smi)
            return {}
        return parse_hy_smi(run_tool([self.hy_smi, "--showproductname", "--showbus"]))

    def _device(self, index: int, node: _KfdNode, names: Mapping[str, str]) -> Device:
        bus = node.bus
        function_dir = self.sysfs / "bus" / "pci" / "devices" / bus
        vram = _read_int(function_dir / "mem_info_vram_total")
        if vram is None:
            banks = sorted(
                (self.sysfs / "class/kfd/kfd/topology/nodes" / str(node.node_id)).glob(
                    "mem_banks/*/properties"
                )
            )
            vram = sum(parse_properties(b.read_text()).get("size_in_bytes", 0) for b in banks)
        unique = node.properties.get("unique_id", 0)
        uuid = f"DCU-{unique:016x}" if unique else f"DCU-{bus}"
        self._buses[uuid] = bus
        render = node.properties.get("drm_render_minor", -1)
        nodes = [device_node(self.dev_root, f"dri/renderD{render}")] if render >= 0 else []
        cards = sorted(p.name for p in (function_dir / "drm").glob("card*"))
        nodes += [device_node(self.dev_root, f"dri/{card}") for card in cards]
        if not nodes:
            raise DiscoveryError(f"DCU {bus} has no DRM device node (render minor missing)")
        function = pci.read_function(self.sysfs, bus)
        self._gbps[bus] = function.link_gbps if function else 0.0
        name = names.get(bus, node.isa or "unknown DCU")
        device = Device(
            uuid=uuid,
            vendor=Vendor.HYGON,
            model=name,
            index=index,
            pci_bus_id=bus,
            vram_bytes=vram,
            numa_node=function.numa_node if function else -1,
            device_nodes=tuple(nodes),
            shared_nodes=existing_nodes(self.dev_root, SHARED_NODES),
            attributes=(
                ("isa", node.isa),
                ("compute_units", str(node.properties.get("simd_count", 0) // 4)),
                ("max_engine_clock_mhz", str(node.properties.get("max_engine_clk_fcompute", 0))),
                *(function.attributes() if function else ()),
            ),
        )
        return fingerprint(Vendor.HYGON, name).apply(device)

    def _links(
        self, node: _KfdNode, device: Device, devices: Sequence[Device], uuid_of: Mapping[int, str]
    ) -> tuple[Link, ...]:
        xgmi = {to: bandwidth for kind, to, bandwidth in node.links if kind == XGMI_LINK_TYPE}
        links = []
        for peer_node, peer_uuid in uuid_of.items():
            if peer_uuid == device.uuid:
                continue
            if peer_node in xgmi:
                links.append(Link(peer_uuid, LinkKind.XGMI, xgmi[peer_node] / 1000 or 46.0))
                continue
            peer = next(d for d in devices if d.uuid == peer_uuid)
            same_numa = peer.numa_node == device.numa_node and device.numa_node >= 0
            kind = LinkKind.PCIE_HOST if same_numa else LinkKind.SYSTEM
            gbps = min(self._gbps.get(device.pci_bus_id, 0.0), self._gbps.get(peer.pci_bus_id, 0.0))
            links.append(Link(peer_uuid, kind, gbps))
        return tuple(links)


def parse_properties(text: str) -> dict[str, int]:
    """KFD's `key value` lines (decimal); lines that are not that are skipped."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    return values


def parse_hy_smi(text: str) -> dict[str, str]:
    """Bus id -> `Card series` from `hy-smi --showproductname --showbus` (`DCU[i] : key: value`)."""
    series: dict[str, str] = {}
    buses: dict[str, str] = {}
    for line in text.splitlines():
        match = _DCU_LINE.match(line.strip())
        if match is None:
            continue
        index, key, value = match.group(1), match.group(2).strip().lower(), match.group(3).strip()
        if key == "card series":
            series[index] = value
        elif key == "pci bus":
            try:
                buses[index] = pci.normalise_address(value)
            except ValueError:
                continue
    return {bus: series[i] for i, bus in buses.items() if i in series}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
