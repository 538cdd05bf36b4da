"""The Hygon backend over a fake KFD topology and amdgpu sysfs, with recorded hy-smi output."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryError
from hcsd.discovery.backends.hygon import HygonBackend, parse_hy_smi, parse_properties
from hcsd.discovery.settings import DiscoverySection
from hcsd.model import DeviceNode, LinkKind
from tests.fakes.nodes import hygon_node, tool

DATA = Path(__file__).parent / "data"
GiB = 2**30


def test_dcus_from_kfd_with_models_from_hy_smi(tmp_path: Path, devfs: Path) -> None:
    node = hygon_node(tmp_path, count=2)
    smi = tool(tmp_path, "hy-smi", DATA / "hy-smi-k100ai.txt")
    devices = HygonBackend(node.section(hy_smi=str(smi))).discover()
    first, second = devices
    assert first.model == "K100-AI"
    assert first.tflops_fp16 == 196.0
    assert first.vram_bytes == 64 * GiB
    assert first.pci_bus_id == "0000:3d:00.0"
    assert first.uuid == "DCU-000000005a5a0000"
    assert first.device_nodes == (
        DeviceNode("/dev/dri/renderD128", 226, 128),
        DeviceNode("/dev/dri/card0", 226, 0),
    )
    assert [n.path for n in first.shared_nodes] == ["/dev/kfd"]
    link = first.link_to(second.uuid)
    assert link is not None and (link.kind, link.gbps) == (LinkKind.XGMI, 92.0)
    assert dict(first.attributes)["isa"] == "gfx928"


def test_without_hy_smi_the_model_is_unknown_not_zero_silently(
    tmp_path: Path, devfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = hygon_node(tmp_path, count=8, xgmi_pairs=False)
    devices = HygonBackend(
        DiscoverySection(
            hy_smi=str(tmp_path / "absent"), sysfs=str(node.sysfs), dev_root=str(node.dev)
        )
    ).discover()
    assert len(devices) == 8
    assert devices[0].model == "gfx928"
    assert dict(devices[0].attributes)["profile"] == "unknown"
    assert devices[0].vram_bytes == 64 * GiB  # the raw figures stay
    assert "not in the profile database" in caplog.text
    assert devices[0].link_to(devices[1].uuid).kind is LinkKind.PCIE_HOST  # type: ignore[union-attr]
    assert devices[0].link_to(devices[7].uuid).kind is LinkKind.SYSTEM  # type: ignore[union-attr]


def test_ecc_counters_from_amdgpu_ras(tmp_path: Path, devfs: Path) -> None:
    node = hygon_node(tmp_path, count=1)
    backend = HygonBackend(node.section(hy_smi="/nonexistent"))
    [device] = backend.discover()
    ras = node.sysfs / "bus/pci/devices/0000:3d:00.0/ras/umc_err_count"
    ras.write_text("ue: 3\nce: 7\n")
    assert backend.health_counters()[device.uuid] == {"ecc_uncorrectable": 3, "ecc_correctable": 7}


def test_no_kfd_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="no KFD topology"):
        HygonBackend(DiscoverySection(sysfs=str(tmp_path))).discover()


def test_hy_smi_parsing_pairs_names_with_buses() -> None:
    names = parse_hy_smi((DATA / "hy-smi-k100ai.txt").read_text())
    assert names == {"0000:3d:00.0": "K100_AI", "0000:40:00.0": "K100_AI"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("simd_count 4\nname x y\n", {"simd_count": 4}, id="skips-bad-lines"),
        pytest.param("", {}, id="empty"),
        pytest.param("domain -1\n", {"domain": -1}, id="negative"),
    ],
)
def test_properties_parsing(text: str, expected: dict[str, int]) -> None:
    assert parse_properties(text) == expected
