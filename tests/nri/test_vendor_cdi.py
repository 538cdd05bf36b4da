"""Driver edits from a vendor's own CDI spec replace the configured driver directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.model import Vendor
from hcsd.runtime.driver_settings import NvidiaDriverFiles
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendor_cdi import vendor_spec_edits
from hcsd.runtime.vendors import vendor_edits
from tests.conftest import gpu
from tests.harness.local import local_node

# The shape `nvidia-ctk cdi generate` writes (trimmed): spec-level edits carry the driver.
NVIDIA_SPEC = """---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
"""


def test_vendor_spec_mounts_and_env_are_used(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text(NVIDIA_SPEC)
    edits = vendor_edits([gpu(0)], vendor_specs=[str(tmp_path / "nvidia*.yaml")])
    mounts = {m.container_path: m for m in edits.mounts}
    assert set(mounts) == {"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/bin/nvidia-smi"}
    assert all(m.read_only for m in mounts.values())
    assert "LD_LIBRARY_PATH" not in dict(edits.env)
    # our selection env wins over the spec's placeholder, devices still come from discovery
    assert dict(edits.env)["NVIDIA_VISIBLE_DEVICES"] == "dev-0"
    assert [n.path for n in edits.devices] == []  # gpu() test devices carry no nodes


def test_malformed_vendor_spec_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "nvidia.yaml").write_text("containerEdits: [not, a, map")
    assert vendor_spec_edits(Vendor.NVIDIA, [str(tmp_path / "nvidia*.yaml")]) is None
    assert "ignoring the vendor CDI spec" in caplog.text


def test_without_a_vendor_spec_the_configured_directories_are_used(tmp_path: Path) -> None:
    driver = tmp_path / "driver"
    driver.mkdir()
    edits = vendor_edits(
        [gpu(0)],
        driver_paths=DriverPaths(
            nvidia=(str(driver), str(tmp_path / "absent")),
            nvidia_files=NvidiaDriverFiles(discover=False),  # whatever driver this host has
        ),
        vendor_specs=[str(tmp_path / "none*.yaml")],
    )
    assert [m.host_path for m in edits.mounts] == [str(driver)]  # only what exists is mounted


def test_no_driver_paths_means_no_driver_mounts(tmp_path: Path) -> None:
    edits = vendor_edits(
        [gpu(0)], driver_paths=DriverPaths(nvidia=()), vendor_specs=[str(tmp_path / "x*.yaml")]
    )
    assert edits.mounts == ()


async def test_cdi_spec_follows_device_changes(tmp_path: Path, mixed_inventory: object) -> None:
    import asyncio
    import json
    from dataclasses import replace

    from hcsd.model import DeviceNode, Request
    from hcsd.runtime.cdi import keep_spec_current, write_spec

    node = local_node(tmp_path, mixed_inventory)
    service = node.service
    spec = tmp_path / "cdi" / "hcs.io-device.yaml"
    drivers = {vendor: tmp_path / f"{vendor}-driver" for vendor in ("ascend", "nvidia")}
    for directory in drivers.values():
        directory.mkdir()
    paths = DriverPaths(ascend=(str(drivers["ascend"]),), nvidia=(str(drivers["nvidia"]),))
    assert write_spec(str(tmp_path / "cdi"), [s.device for s in service.devices()], paths)
    assert not write_spec(str(tmp_path / "cdi"), [s.device for s in service.devices()], paths)
    task = asyncio.create_task(keep_spec_current(str(tmp_path / "cdi"), service, paths))
    await asyncio.sleep(0)
    before = spec.stat().st_mtime_ns
    service.allocate(Request("c", vram_bytes=2**30))  # usage changes: no rewrite
    await asyncio.sleep(0.05)
    assert spec.stat().st_mtime_ns == before
    device = service.devices()[0].device
    service.set_device(replace(device, device_nodes=(DeviceNode("/dev/nvidia7", 195, 7),)))
    await asyncio.sleep(0.05)
    names = {e["name"]: e for e in json.loads(spec.read_text())["devices"]}
    nodes = [n["path"] for n in names[device.uuid]["containerEdits"]["deviceNodes"]]
    assert "/dev/nvidia7" in nodes
    # each vendor's configured driver, in the rewritten spec too
    for name, vendor in ((device.uuid, "ascend"), ("nvidia-0", "nvidia")):
        mounts = [m["hostPath"] for m in names[name]["containerEdits"]["mounts"]]
        assert mounts == [str(drivers[vendor])]
    task.cancel()
    node.close()
