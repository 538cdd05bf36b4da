from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryError, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend, load_node_file
from hcsd.model import LinkKind, Vendor
from tests.conftest import MIXED_NODE, GiB


def test_mixed_node_has_the_six_devices_of_the_example() -> None:
    devices = load_node_file(MIXED_NODE)
    by_vendor: dict[Vendor, list[str]] = {}
    for d in devices:
        by_vendor.setdefault(d.vendor, []).append(d.model)
    assert by_vendor == {
        Vendor.NVIDIA: ["A100-SXM4-80GB"] * 2,
        Vendor.ASCEND: ["Ascend910B3"] * 2,
        Vendor.HYGON: ["Z100"],
        Vendor.CAMBRICON: ["MLU370-X8"],
    }
    a100 = next(d for d in devices if d.vendor is Vendor.NVIDIA)
    assert a100.vram_bytes == 80 * GiB
    assert next(n.path for n in a100.shared_nodes) == "/dev/nvidiactl"


def test_links_are_symmetric(mixed_inventory) -> None:  # type: ignore[no-untyped-def]
    by_uuid = mixed_inventory.by_uuid()
    for device in mixed_inventory.devices:
        for link in device.links:
            back = by_uuid[link.peer_uuid].link_to(device.uuid)
            assert back is not None and back.kind == link.kind
    kinds = {link.kind for d in mixed_inventory.devices for link in d.links}
    assert kinds == {LinkKind.NVLINK, LinkKind.HCCS}


BASE = """
[[device]]
uuid = "a"
vendor = "nvidia"
model = "T4"
index = 0
pci_bus_id = "0000:01:00.0"
vram = "16Gi"
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "at least one", id="no-devices"),
        pytest.param("[[device]]\nuuid='a'\n", "missing key 'vendor'", id="missing-key"),
        pytest.param(BASE.replace('"16Gi"', '"16GB"'), "invalid quantity '16GB'", id="bad-vram"),
        pytest.param(BASE.replace('"nvidia"', '"intel"'), "unknown vendor", id="bad-vendor"),
        pytest.param(BASE + "colour = 1\n", "unknown key", id="unknown-key"),
        pytest.param(BASE + BASE, "duplicate uuid", id="duplicate"),
        pytest.param(BASE + 'nodes = ["nvidia0"]\n', "expected /dev/NAME", id="bad-node"),
        pytest.param(
            BASE + '[[link]]\na="a"\nb="zz"\nkind="nvlink"\ngbps=1\n',
            "unknown device zz",
            id="dangling-link",
        ),
        pytest.param("[[device]\n", "failed to parse", id="bad-toml"),
    ],
)
def test_bad_node_files_are_refused_with_the_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(DiscoveryError, match=message):
        load_node_file(path)


def test_missing_node_file(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="failed to read node file"):
        discover_all("n", [SimulatedBackend(tmp_path / "absent.toml")])


def test_duplicate_bus_ids_across_backends_are_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text(BASE)
    two.write_text(BASE.replace('uuid = "a"', 'uuid = "b"'))
    with pytest.raises(DiscoveryError, match="share PCI bus id"):
        discover_all("n", [SimulatedBackend(one), SimulatedBackend(two)])
