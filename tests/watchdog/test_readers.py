"""Each vendor reader over the fake library (or sysfs tree) that follows the vendor's ABI."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from hcsd.discovery.settings import DiscoverySection
from hcsd.model import Device, Vendor
from hcsd.watchdog.readers import readers_for
from hcsd.watchdog.readers.cndev import CndevReader, ProcessInfo
from hcsd.watchdog.readers.dcmi import DcmiReader, ProcMemInfo
from hcsd.watchdog.readers.kfd import KfdReader
from hcsd.watchdog.readers.nvml import NvmlReader, ProcessInfoV1, ProcessInfoV2
from hcsd.watchdog.usage import ProcessUsage, ReaderError
from tests.fakes.nodes import ascend_node, cambricon_node, hygon_node, kfd_gpu_id
from tests.watchdog.conftest import UUIDS, GiB, GpuNode, gpu_devices

MiB = 2**20


def test_struct_layouts_match_the_vendor_headers() -> None:
    # nvml.h: v1 {pid, usedGpuMemory}; v2 = v3 {pid, usedGpuMemory, gpuInstanceId,
    # computeInstanceId}; pynvml (NVIDIA's own bindings) agrees on the latter.
    assert ctypes.sizeof(ProcessInfoV1) == 16 and ProcessInfoV1.usedGpuMemory.offset == 8
    assert ctypes.sizeof(ProcessInfoV2) == ctypes.sizeof(pynvml.c_nvmlProcessInfo_v2_t) == 24
    for name, _ in ProcessInfoV2._fields_:
        assert (
            getattr(ProcessInfoV2, name).offset
            == getattr(pynvml.c_nvmlProcessInfo_v2_t, name).offset
        )
    assert ctypes.sizeof(ProcMemInfo) == 16  # {int proc_id; unsigned long proc_mem_usage;}
    assert ctypes.sizeof(ProcessInfo) == 24  # {int version; unsigned pid; u64; u64}


@pytest.fixture
def nvml(gpu_node: GpuNode) -> Iterator[NvmlReader]:
    reader = NvmlReader(gpu_devices(2), library=str(gpu_node.library))
    yield reader
    reader.close()


def test_nvml_lists_processes_of_both_lists_once(gpu_node: GpuNode, nvml: NvmlReader) -> None:
    gpu_node.add_process(0, 4001, 3 * GiB)
    gpu_node.add_process(1, 4002, 1 * GiB, "graphics")
    gpu_node.add_process(1, 4002, 2 * GiB)  # C+G: one process, nvidia-smi shows it once
    sample = nvml.read()
    assert nvml.abi == "v3"
    assert sorted(sample.processes, key=lambda p: p.pid) == [
        ProcessUsage(UUIDS[0], 4001, 3 * GiB),
        ProcessUsage(UUIDS[1], 4002, 2 * GiB),
    ]
    assert sample.per_process == set(UUIDS[:2])
    assert {t.device_uuid: t.used_bytes for t in sample.totals} == {
        UUIDS[0]: 3 * GiB,
        UUIDS[1]: 3 * GiB,  # the fake's total counts both lists, as a driver's would
    }


def test_nvml_grows_its_buffer_on_insufficient_size(gpu_node: GpuNode, nvml: NvmlReader) -> None:
    for pid in range(5000, 5300):  # more than the 64 entries the first call has room for
        gpu_node.records.append(("process", {"device": 0, "pid": pid, "used": pid}))
    gpu_node.write()
    sample = nvml.read()
    assert sorted(p.pid for p in sample.processes) == list(range(5000, 5300))
    assert all(p.used_bytes == p.pid for p in sample.processes)
    gpu_node.records = gpu_node.records[:2]  # all gone: SUCCESS with a count of 0
    gpu_node.write()
    assert nvml.read().processes == []


def test_nvml_v1_layout_of_an_old_driver(gpu_node: GpuNode, fake_libs: Path) -> None:
    gpu_node.add_process(0, 4001, 5 * GiB)
    gpu_node.add_process(0, 4003, 7 * GiB)
    reader = NvmlReader(gpu_devices(2), library=str(fake_libs / "v1" / "libnvidia-ml.so.1"))
    try:
        sample = reader.read()
    finally:
        reader.close()
    # With the 24-byte layout on 16-byte entries the second pid would read as garbage.
    assert reader.abi == "v1"
    assert sorted((p.pid, p.used_bytes) for p in sample.processes) == [
        (4001, 5 * GiB),
        (4003, 7 * GiB),
    ]


def test_nvml_device_without_process_list_is_judged_on_its_total(
    gpu_node: GpuNode, nvml: NvmlReader
) -> None:
    gpu_node.records[1][1]["processes"] = "unsupported"
    gpu_node.add_process(1, 4001, GiB)
    sample = nvml.read()
    assert sample.per_process == {UUIDS[0]}
    assert {t.device_uuid for t in sample.totals} == set(UUIDS[:2])


def test_nvml_missing_library_is_a_reader_error(tmp_path: Path) -> None:
    reader = NvmlReader(gpu_devices(1), library=str(tmp_path / "libnvidia-ml.so.1"))
    with pytest.raises(ReaderError, match="failed to load NVML"):
        reader.read()


def test_kfd_reads_vram_per_process_from_sysfs(tmp_path: Path) -> None:
    node = hygon_node(tmp_path, count=2, mknod=False)
    devices = [
        Device(f"DCU-{i}", Vendor.HYGON, "K100", i, f"0000:{0x3D + 3 * i:02x}:00.0", 64 * GiB)
        for i in range(2)
    ]
    proc = node.sysfs / "class" / "kfd" / "kfd" / "proc"
    for pid, files in {
        "3001": {f"vram_{kfd_gpu_id(0)}": "1073741824\n", f"sdma_{kfd_gpu_id(0)}": "5\n"},
        "3002": {f"vram_{kfd_gpu_id(0)}": "0\n", f"vram_{kfd_gpu_id(1)}": "2147483648\n"},
        "3003": {"vram_999": "7\n"},  # a GPU that is not ours
        "self": {},
    }.items():
        (proc / pid).mkdir(parents=True)
        for name, text in files.items():
            (proc / pid / name).write_text(text)
    sample = KfdReader(devices, sysfs=node.sysfs).read()
    assert sorted((p.device_uuid, p.pid, p.used_bytes) for p in sample.processes) == [
        ("DCU-0", 3001, GiB),
        ("DCU-0", 3002, 0),
        ("DCU-1", 3002, 2 * GiB),
    ]
    assert sample.per_process == {"DCU-0", "DCU-1"}
    assert [t.used_bytes for t in sample.totals] == [GiB, GiB]  # mem_info_vram_used


def test_kfd_before_linux_5_8_has_totals_only(tmp_path: Path) -> None:
    node = hygon_node(tmp_path, count=1, mknod=False)
    devices = [Device("DCU-0", Vendor.HYGON, "K100", 0, "0000:3d:00.0", 64 * GiB)]
    sample = KfdReader(devices, sysfs=node.sysfs).read()
    assert sample.per_process == set() and len(sample.totals) == 1


def _ascend_devices(count: int) -> list[Device]:
    return [
        Device(f"NPU-{i}", Vendor.ASCEND, "910B3", i, f"0000:{0xC1 + i:02x}:00.0", 64 * GiB)
        for i in range(count)
    ]


def test_dcmi_reads_processes_per_chip(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = ascend_node(tmp_path, count=2, mknod=False)
    records = node.config.read_text() + (
        "process card=0 device=0 pid=7001 used=3221225472\n"
        "process card=1 device=0 pid=7002 used=1073741824\n"
        "process card=1 device=0 pid=7003 used=5\n"
    )
    node.config.write_text(records)
    monkeypatch.setenv("FAKE_DCMI_CONFIG", str(node.config))
    sample = DcmiReader(_ascend_devices(2), library=str(fake_libs / "libdcmi.so")).read()
    assert sorted((p.device_uuid, p.pid, p.used_bytes) for p in sample.processes) == [
        ("NPU-0", 7001, 3 * GiB),
        ("NPU-1", 7002, GiB),
        ("NPU-1", 7003, 5),
    ]
    assert sample.per_process == {"NPU-0", "NPU-1"}
    assert [t.used_bytes for t in sample.totals] == [3161 * MiB, 3161 * MiB]


def test_dcmi_chip_without_process_accounting(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = ascend_node(tmp_path, count=1, mknod=False)
    node.config.write_text(
        node.config.read_text().replace("health=0", "health=0 processes=unsupported")
    )
    monkeypatch.setenv("FAKE_DCMI_CONFIG", str(node.config))
    sample = DcmiReader(_ascend_devices(1), library=str(fake_libs / "libdcmi.so")).read()
    assert sample.per_process == set() and len(sample.totals) == 1


def test_cndev_reads_processes_in_kib_and_grows(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = cambricon_node(tmp_path, count=2, mknod=False)
    lines = [f"process device=1 pid={9000 + i} used_kib={i}" for i in range(100)]
    node.config.write_text(
        node.config.read_text() + "process device=0 pid=8001 used_kib=2097152\n" + "\n".join(lines)
    )
    monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(node.config))
    devices = [
        Device(f"MLU-{i}", Vendor.CAMBRICON, "MLU370-X8", i, f"0000:{0x3D + i:02x}:00.0", 48 * GiB)
        for i in range(2)
    ]
    reader = CndevReader(devices, library=str(fake_libs / "libcndev.so"))
    try:
        sample = reader.read()
    finally:
        reader.close()
    by_device: dict[str, list[ProcessUsage]] = {}
    for p in sample.processes:
        by_device.setdefault(p.device_uuid, []).append(p)
    assert [(p.pid, p.used_bytes) for p in by_device["MLU-0"]] == [(8001, 2 * GiB)]
    assert len(by_device["MLU-1"]) == 100  # past the 64 the first call had room for
    assert by_device["MLU-1"][7].used_bytes == 7 * 1024
    assert [t.used_bytes for t in sample.totals] == [1024 * MiB, 1024 * MiB]


def test_one_reader_per_vendor_present() -> None:
    devices = [*gpu_devices(1), *_ascend_devices(1)]
    discovery = DiscoverySection(dcmi_library="/opt/dcmi.so")
    readers = readers_for(devices, discovery)
    assert [r.name for r in readers] == ["nvml", "dcmi"]
    assert readers[1].library == "/opt/dcmi.so"  # type: ignore[attr-defined]
    assert readers_for([], discovery) == []
