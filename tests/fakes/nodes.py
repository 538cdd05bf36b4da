"""Whole fake nodes per vendor: library config + sysfs + /dev, as a test or benchmark needs them.

Each builder returns the paths a backend takes (config for the fake library, sysfs root, device
root) so the same node serves the tests, the benchmark and a demo of real backends over fakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hcsd.discovery import DiscoveryBackend
from hcsd.discovery.settings import DiscoverySection
from hcsd.model import Device
from tests.fakes import Function, make_devfs, make_sysfs, write_config

__all__ = ["FakeNode", "discover_once", "nvidia_node"]

A100 = "NVIDIA A100-SXM4-80GB"
GiB = 2**30


@dataclass
class FakeNode:
    config: Path
    sysfs: Path
    dev: Path
    env: dict[str, str] = field(default_factory=dict)

    def section(self, **paths: str) -> DiscoverySection:
        """`[discovery]` pointed at this node's sysfs and /dev, and at what `paths` name (the
        fake library or tool a test means)."""
        return DiscoverySection(sysfs=str(self.sysfs), dev_root=str(self.dev), **paths)


def discover_once(backend: DiscoveryBackend) -> list[Device]:
    """What the backend finds, closed afterwards whatever happened (it may hold a library)."""
    try:
        return list(backend.discover())
    finally:
        backend.close()


def nvidia_bus(index: int) -> str:
    return f"0000:{0x17 + 0x10 * index:02x}:00.0"


def nvidia_node(
    root: Path,
    *,
    count: int = 8,
    topology: str = "nvswitch",  # "nvswitch" (HGX), "pairs" (bridged pairs), "pcie"
    name: str = A100,
    overrides: Mapping[int, Mapping[str, object]] | None = None,
    mknod: bool = True,
) -> FakeNode:
    """`count` GPUs; NVSwitch nodes get 12 links per GPU to 6 switches (NVLink 3)."""
    records: list[tuple[str, Mapping[str, object]]] = [("driver", {"version": "550.54.15"})]
    functions = []
    for i in range(count):
        bus = nvidia_bus(i)
        values: dict[str, object] = {
            "uuid": f"GPU-00000000-0000-0000-0000-{i:012x}",
            "name": name,
            "bus": "0000" + bus,  # NVML's 8-digit domain
            "memory": 80 * GiB,
            "used": 512 * 2**20,
            "cc": "8.0",
            "minor": i,
            "mig": 0,
            "retired": "unsupported",  # Ampere remaps rows instead
        }
        values.update((overrides or {}).get(i, {}))
        records.append(("device", values))
        functions.append(Function(bus, 0x10DE, 0x20B2, numa_node=0 if i < count // 2 else 1))
    if topology == "nvswitch":
        for i in range(count):
            for link in range(12):
                remote = f"00000000:{0xC0 + link // 2:02x}:00.0"  # six NVSwitches
                records.append(("nvlink", {"device": i, "link": link, "remote": remote}))
    elif topology == "pairs":
        for i in range(0, count - 1, 2):
            for a, b in ((i, i + 1), (i + 1, i)):
                for link in range(4):
                    remote = "0000" + nvidia_bus(b)
                    records.append(("nvlink", {"device": a, "link": link, "remote": remote}))
    for a in range(count):
        for b in range(a + 1, count):
            same_socket = (a < count // 2) == (b < count // 2)
            level = 20 if same_socket else 50
            records.append(("topo", {"a": a, "b": b, "level": level, "p2p": 0}))
    node = FakeNode(
        config=write_config(root / "nvml.conf", records),
        sysfs=make_sysfs(root / "sys", functions),
        dev=root / "dev",
    )
    node.dev.mkdir(exist_ok=True)
    if mknod:
        nodes = {f"nvidia{i}": (195, i) for i in range(count)}
        nodes |= {"nvidiactl": (195, 255), "nvidia-uvm": (235, 0), "nvidia-uvm-tools": (235, 1)}
        make_devfs(node.dev, nodes)
    node.env = {"FAKE_NVML_CONFIG": str(node.config)}
    return node


def ascend_node(root: Path, *, count: int = 8, chip: str = "910B3", mknod: bool = True) -> FakeNode:
    """`count` chips, one per card, all joined by HCCS (an Atlas 800T A2)."""
    records: list[tuple[str, Mapping[str, object]]] = []
    functions = []
    for i in range(count):
        bus = f"0000:{0xC1 + i:02x}:00.0"
        values: dict[str, object] = {
            "card": i,
            "device": 0,
            "logic": i,
            "chip_type": "Ascend",
            "chip_name": chip,
            "hbm_mb": 65536,
            "hbm_used_mb": 3161,
            "health": 0,
            "bus": bus,
        }
        records.append(("device", values))
        functions.append(Function(bus, 0x19E5, 0xD802, class_code=0x120000, numa_node=i // 4))
    for a in range(count):
        for b in range(a + 1, count):
            records.append(
                ("topo", {"card1": a, "device1": 0, "card2": b, "device2": 0, "type": 3})
            )
    node = FakeNode(
        config=write_config(root / "dcmi.conf", records),
        sysfs=make_sysfs(root / "sys", functions),
        dev=root / "dev",
    )
    node.dev.mkdir(exist_ok=True)
    if mknod:
        nodes = {f"davinci{i}": (236, i) for i in range(count)}
        nodes |= {"davinci_manager": (237, 0), "devmm_svm": (238, 0), "hisi_hdc": (239, 0)}
        make_devfs(node.dev, nodes)
    node.env = {"FAKE_DCMI_CONFIG": str(node.config)}
    return node


def tool(root: Path, name: str, output: Path) -> Path:
    """An executable standing in for a vendor tool: prints a recorded output."""
    path = root / name
    path.write_text(f"#!/bin/sh\ncat '{output}'\n")
    path.chmod(0o755)
    return path


def kfd_gpu_id(index: int) -> int:
    """The KFD gpu_id of the index-th DCU (KFD derives it from a hash; any stable value)."""
    return 41000 + 17 * index


def hygon_node(
    root: Path, *, count: int = 8, xgmi_pairs: bool = True, mknod: bool = True
) -> FakeNode:
    """A KFD topology with one CPU node and `count` DCUs (pairs joined by xGMI), amdgpu sysfs."""
    functions = []
    kfd = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    cpu = kfd / "0"
    cpu.mkdir(parents=True)
    (cpu / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    (cpu / "gpu_id").write_text("0\n")
    dev_nodes: dict[str, tuple[int, int]] = {"kfd": (510, 0)}
    for i in range(count):
        bus_number = 0x3D + 3 * i
        bus = f"0000:{bus_number:02x}:00.0"
        path = kfd / str(i + 1)
        path.mkdir()
        (path / "name").write_text("gfx928\n")
        (path / "gpu_id").write_text(f"{kfd_gpu_id(i)}\n")
        (path / "properties").write_text(
            f"simd_count 480\nvendor_id {0x1D94}\ndevice_id {0x6210}\n"
            f"location_id {bus_number << 8}\n"
            f"domain 0\ndrm_render_minor {128 + i}\nunique_id {0x5A5A0000 + i}\n"
            "max_engine_clk_fcompute 1500\n"
        )
        bank = path / "mem_banks" / "0"
        bank.mkdir(parents=True)
        (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {64 * GiB}\n")
        if xgmi_pairs:
            peer = i + 2 if i % 2 == 0 else i
            link = path / "io_links" / "0"
            link.mkdir(parents=True)
            link.joinpath("properties").write_text(
                f"type 11\nnode_from {i + 1}\nnode_to {peer}\nmax_bandwidth 92000\n"
            )
        functions.append(
            Function(
                bus,
                0x1D94,
                0x6210,
                class_code=0x038000,
                numa_node=i // 4,
                extra={
                    "mem_info_vram_total": str(64 * GiB),
                    "mem_info_vram_used": str(GiB),
                    "ras/umc_err_count": "ue: 0\nce: 0",
                    f"drm/card{i}/dev": f"226:{i}",
                },
            )
        )
        dev_nodes[f"dri/renderD{128 + i}"] = (226, 128 + i)
        dev_nodes[f"dri/card{i}"] = (226, i)
    node = FakeNode(
        config=root / "none", sysfs=make_sysfs(root / "sys", functions), dev=root / "dev"
    )
    node.dev.mkdir(exist_ok=True)
    if mknod:
        make_devfs(node.dev, dev_nodes)
    return node


def cambricon_node(root: Path, *, count: int = 8, mknod: bool = True) -> FakeNode:
    """`count` MLU370-X8 cards in a ring of MLU-Links (two ports to each neighbour)."""
    records: list[tuple[str, Mapping[str, object]]] = []
    functions = []
    uuid = "20001012-1916-0000-0000-{:012x}".format  # CNDev: 36 characters, no prefix
    for i in range(count):
        bus = f"0000:{0x3D + i:02x}:00.0"
        records.append(
            (
                "device",
                {
                    "name": "MLU370-X8",
                    "uuid": uuid(i),
                    "memory_mb": 49152,
                    "used_mb": 1024,
                    "bus": bus,
                    "health": 1,
                    "ports": 4 if count > 1 else 0,
                },
            )
        )
        functions.append(Function(bus, 0xCABC, 0x0370, class_code=0x120000, numa_node=i // 4))
        if count > 1:
            for port, peer in enumerate([(i + 1) % count] * 2 + [(i - 1) % count] * 2):
                records.append(("mlulink", {"device": i, "port": port, "remote_uuid": uuid(peer)}))
    node = FakeNode(
        config=write_config(root / "cndev.conf", records),
        sysfs=make_sysfs(root / "sys", functions),
        dev=root / "dev",
    )
    node.dev.mkdir(exist_ok=True)
    if mknod:
        nodes = {f"cambricon_dev{i}": (240, i) for i in range(count)}
        nodes |= {f"cambricon_ipcm{i}": (241, i) for i in range(count)}
        nodes |= {"cambricon_ctl": (242, 0)}
        make_devfs(node.dev, nodes)
    node.env = {"FAKE_CNDEV_CONFIG": str(node.config)}
    return node
