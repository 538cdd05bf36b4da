"""PCI ground truth: accelerators by vendor and class, NUMA node and link, from sysfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hcsd.discovery import pci
from hcsd.model import Vendor
from tests.fakes import Function, make_sysfs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="sysfs"),
        pytest.param("3b:00.1", "0000:3b:00.1", id="no-domain"),
        pytest.param(" 0001:C1:1f.7\n", "0001:c1:1f.7", id="spaces"),
    ],
)
def test_addresses_normalise(text: str, expected: str) -> None:
    assert pci.normalise_address(text) == expected


@pytest.mark.parametrize("text", ["", "3b:00", "zz:00.0", "0000:3b:00.8", "100000000:3b:00.0"])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="PCI"):
        pci.normalise_address(text)


def test_scan_keeps_accelerators_of_known_vendors(tmp_path: Path) -> None:
    sysfs = make_sysfs(
        tmp_path,
        [
            Function("0000:17:00.0", 0x10DE, 0x20B2, numa_node=0, driver="nvidia"),
            Function("0000:c0:00.0", 0x10DE, 0x1AF1, class_code=0x068000),  # NVSwitch bridge
            Function("0000:c1:00.0", 0x19E5, 0xD802, class_code=0x120000, numa_node=1),
            Function("0000:05:00.0", 0x19E5, 0x1822, class_code=0x020000),  # Huawei NIC
            Function("0000:00:00.0", 0x1D94, 0x1450, class_code=0x060000),  # Hygon host bridge
            Function("0000:3d:00.0", 0x1D94, 0x6210, class_code=0x038000, speed="8 GT/s"),
            Function("0000:4d:00.0", 0xCABC, 0x0370, class_code=0x120000),
            Function("0000:01:00.0", 0x8086, 0x1234),  # someone else's GPU
        ],
    )
    found = pci.scan(sysfs)
    assert [(f.address, f.vendor) for f in found] == [
        ("0000:17:00.0", Vendor.NVIDIA),
        ("0000:3d:00.0", Vendor.HYGON),
        ("0000:4d:00.0", Vendor.CAMBRICON),
        ("0000:c1:00.0", Vendor.ASCEND),
    ]
    nvidia = found[0]
    assert (nvidia.numa_node, nvidia.link_speed, nvidia.link_width) == (0, 16.0, 16)
    assert nvidia.driver == "nvidia"
    assert nvidia.link_gbps == 31.51  # 16 GT/s x16, 128b/130b
    assert found[1].link_gbps == 15.75  # 8 GT/s x16


def test_a_garbled_attribute_skips_the_function(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path, [Function("0000:17:00.0", 0x10DE, 0x20B2)])
    (sysfs / "bus/pci/devices/0000:17:00.0/vendor").write_text("nvidia\n")
    assert pci.scan(sysfs) == []


def test_read_function_of_an_absent_device_is_none(tmp_path: Path) -> None:
    assert pci.read_function(tmp_path, "0000:17:00.0") is None


@pytest.mark.skipif(not os.path.isdir("/sys/bus/pci/devices"), reason="no PCI bus in sysfs")
def test_udev_enumeration_matches_the_sysfs_walk() -> None:
    """On the live system the list comes from libudev; it must see what sysfs lists."""
    from_udev = sorted(p.name for p in pci._function_paths(Path("/sys")))
    assert from_udev == sorted(os.listdir("/sys/bus/pci/devices"))
