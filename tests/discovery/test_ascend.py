"""The Ascend backend over a fake libdcmi.so, and its npu-smi fallback over recorded output."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryError
from hcsd.discovery.backends.ascend import AscendBackend, parse_npu_smi
from hcsd.discovery.settings import DiscoverySection
from hcsd.model import DeviceNode, HealthState, LinkKind
from tests.fakes import make_devfs, write_config
from tests.fakes.nodes import ascend_node, tool

DATA = Path(__file__).parent / "data"
GiB = 2**30


def backend_for(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch, **kw: object
) -> AscendBackend:
    node = ascend_node(tmp_path, **kw)  # type: ignore[arg-type]
    monkeypatch.setenv("FAKE_DCMI_CONFIG", str(node.config))
    return AscendBackend(node.section(dcmi_library=str(fake_libs / "libdcmi.so")))


def test_eight_910b_chips_over_hccs(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = backend_for(tmp_path, fake_libs, monkeypatch).discover()
    assert len(devices) == 8
    first = devices[0]
    assert first.model == "Ascend910B3"
    assert first.vram_bytes == 64 * GiB
    assert first.tflops_fp16 == 313.0
    assert first.pci_bus_id == "0000:c1:00.0"
    assert first.uuid.startswith("NPU-")
    assert first.device_nodes == (DeviceNode("/dev/davinci0", 236, 0),)
    assert {n.path for n in first.shared_nodes} == {
        "/dev/davinci_manager",
        "/dev/devmm_svm",
        "/dev/hisi_hdc",
    }
    assert all(link.kind is LinkKind.HCCS and link.gbps == 56.0 for link in first.links)
    assert len(first.links) == 7
    assert devices[4].numa_node == 1


def test_health_and_error_codes(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_for(tmp_path, fake_libs, monkeypatch, count=2)
    config = Path(str(tmp_path / "dcmi.conf"))
    text = config.read_text().replace("logic=1 ", "logic=1 health=2 errors=0x80CB8009 ", 1)
    config.write_text(text.replace("health=0 bus=0000:c2", "bus=0000:c2"))
    devices = backend.discover()
    assert devices[0].health_state is HealthState.HEALTHY
    assert devices[1].health_state is HealthState.UNHEALTHY
    assert dict(devices[1].attributes)["error_codes"] == "0x80CB8009"
    counters = backend.health_counters()
    assert counters[devices[1].uuid]["device_errors"] == 1
    assert counters[devices[0].uuid]["ecc_uncorrectable"] == 0


def test_310p_reports_ddr_and_pcie_links(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [
        (
            "device",
            {
                "card": 0,
                "device": d,
                "logic": d,
                "chip_name": "310P3",
                "hbm_mb": 0,
                "memory_mb": 21527,
                "bus": f"0000:0{d + 1}:00.0",
            },
        )
        for d in range(2)
    ]
    records.append(("topo", {"card1": 0, "device1": 0, "card2": 0, "device2": 1, "type": 5}))
    monkeypatch.setenv("FAKE_DCMI_CONFIG", str(write_config(tmp_path / "c", records)))
    make_devfs(devfs, {"davinci0": (236, 0), "davinci1": (236, 1)})
    backend = AscendBackend(
        DiscoverySection(
            dcmi_library=str(fake_libs / "libdcmi.so"), sysfs=str(tmp_path), dev_root=str(devfs)
        )
    )
    first, second = backend.discover()
    assert first.model == "Ascend310P3"
    assert first.vram_bytes == 21527 * 2**20
    assert first.link_to(second.uuid).kind is LinkKind.PCIE_SWITCH  # type: ignore[union-attr]
    assert first.shared_nodes == ()  # none present under this /dev


@pytest.mark.parametrize(
    ("recording", "names", "memory_mb", "health"),
    [
        pytest.param(
            "npu-smi-910b.txt", ["910B3"] * 4, "65536", ["ok", "ok", "warning", "ok"], id="910b"
        ),
        pytest.param("npu-smi-310p.txt", ["310P3"] * 2, "21527", ["ok", "ok"], id="310p-duo"),
    ],
)
def test_npu_smi_parsing(
    recording: str, names: list[str], memory_mb: str, health: list[str]
) -> None:
    chips = parse_npu_smi((DATA / recording).read_text())
    assert [c["name"] for c in chips] == names
    assert {c["memory_mb"] for c in chips} == {memory_mb}
    assert [c["health"] for c in chips] == health


def test_npu_smi_fallback_when_dcmi_is_missing(tmp_path: Path, devfs: Path) -> None:
    make_devfs(devfs, {f"davinci{i}": (236, i) for i in range(4)})
    smi = tool(tmp_path, "npu-smi", DATA / "npu-smi-910b.txt")
    backend = AscendBackend(
        DiscoverySection(
            dcmi_library=str(tmp_path / "missing.so"),
            npu_smi=str(smi),
            sysfs=str(tmp_path),
            dev_root=str(devfs),
        )
    )
    devices = backend.discover()
    assert [d.pci_bus_id for d in devices] == [
        "0000:c1:00.0",
        "0000:c2:00.0",
        "0000:81:00.0",
        "0000:82:00.0",
    ]
    assert devices[2].health_state is HealthState.DEGRADED
    assert devices[0].model == "Ascend910B3"
    assert dict(devices[0].attributes)["source"] == "npu-smi"


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("", id="empty"),
        pytest.param("| garbage | in | table |\n" * 3, id="garbage"),
        pytest.param("| 0  910B3 | OK | x |\n| 0 | 0000:zz:00.0 | 1 / 2 |\n", id="bad-bus"),
    ],
)
def test_npu_smi_nonsense_is_a_clear_error(tmp_path: Path, output: str) -> None:
    recorded = tmp_path / "out.txt"
    recorded.write_text(output)
    smi = tool(tmp_path, "npu-smi", recorded)
    backend = AscendBackend(
        DiscoverySection(dcmi_library=str(tmp_path / "missing.so"), npu_smi=str(smi))
    )
    with pytest.raises(DiscoveryError, match="npu-smi info listed no NPU"):
        backend.discover()


def test_npu_smi_missing_is_a_clear_error(tmp_path: Path) -> None:
    backend = AscendBackend(
        DiscoverySection(dcmi_library=str(tmp_path / "x.so"), npu_smi=str(tmp_path / "npu-smi"))
    )
    with pytest.raises(DiscoveryError, match=r"failed to run npu-smi: .* not found"):
        backend.discover()
