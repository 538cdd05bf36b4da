"""Driver edits from a vendor's own CDI spec replace the configured driver directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.model import Vendor
from hcsd.runtime.vendor_cdi import vendor_spec_edits
from hcsd.runtime.vendors import vendor_edits
from tests.conftest import gpu

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
        driver_paths={"nvidia": [str(driver)]},
        vendor_specs=[str(tmp_path / "none*.yaml")],
    )
    assert [m.host_path for m in edits.mounts] == [str(driver)]
