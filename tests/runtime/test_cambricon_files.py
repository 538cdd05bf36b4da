"""The Cambricon driver's files found as Cambricon's device plugin finds them, in a fake host root
laid out as the driver installs itself: cnmon in /usr/bin (the plugin's --cnmon-path), libcndev
in the system library directory (where the plugin looks for it), the Neuware toolkit in
/usr/local/neuware. The same search as NVIDIA's, with Cambricon's lists."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hcsd.model import Device, Vendor
from hcsd.runtime.driver_files import driver_file_mounts
from hcsd.runtime.driver_settings import CambriconDriverFiles, NvidiaDriverFiles
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendors import vendor_edits
from tests.conftest import gpu
from tests.harness.fake_driver import (
    LIB_DIR,
    directory,
    fake_driver,
    shared_object,
    update_cache,
)

NEUWARE_LIB = "usr/local/neuware/lib64"


def _tool(path: Path) -> None:
    directory(path.parent)
    path.write_text("#!/bin/sh\necho fake cnmon\n")
    path.chmod(0o755)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("hcsd mounts only root's files: the fake driver is root's only as root")
    root = tmp_path / "host"
    directory(root / LIB_DIR)
    directory(root / NEUWARE_LIB)
    shared_object(root / LIB_DIR / "libcndev.so", "libcndev.so", "cndevInit")
    shared_object(root / NEUWARE_LIB / "libcnrt.so", "libcnrt.so", "cnrtInit")
    _tool(root / "usr/bin/cnmon")
    update_cache(root, LIB_DIR, NEUWARE_LIB)
    return root


def mounts_of(files: CambriconDriverFiles) -> dict[str, str]:
    found = driver_file_mounts(files)
    assert all(m.read_only for m in found)
    return {m.container_path: m.host_path for m in found}


def mlu(index: int) -> Device:
    return gpu(index, model="MLU370-X8", vendor=Vendor.CAMBRICON)


def test_cnmon_is_mounted_alone_at_its_host_path(root: Path) -> None:
    # the plugin mounts cnmon and no library: the images bring their own Neuware
    assert mounts_of(CambriconDriverFiles(driver_root=str(root))) == {
        "/usr/bin/cnmon": str(root / "usr/bin/cnmon")
    }


def test_cnmon_elsewhere_keeps_its_own_path(root: Path) -> None:
    (root / "usr/bin/cnmon").unlink()
    _tool(root / "usr/local/bin/cnmon")
    mounts = mounts_of(CambriconDriverFiles(driver_root=str(root)))
    assert mounts == {"/usr/local/bin/cnmon": str(root / "usr/local/bin/cnmon")}
    moved = mounts_of(CambriconDriverFiles(driver_root=str(root), container_binary_dir="/opt/x"))
    assert moved == {"/opt/x/cnmon": str(root / "usr/local/bin/cnmon")}


def test_listed_libraries_come_from_the_cache_file_by_file(root: Path) -> None:
    files = CambriconDriverFiles(driver_root=str(root), libraries=("libcndev.so", "libcnrt.so"))
    mounts = mounts_of(files)
    assert mounts["/usr/local/neuware/lib64/libcndev.so"] == str(root / LIB_DIR / "libcndev.so")
    assert mounts["/usr/local/neuware/lib64/libcnrt.so"] == str(root / NEUWARE_LIB / "libcnrt.so")
    narrow = CambriconDriverFiles(
        driver_root=str(root), libraries=("libcnrt.so",), library_dirs=(f"/{LIB_DIR}",)
    )
    assert "/usr/local/neuware/lib64/libcnrt.so" not in mounts_of(narrow)  # not an allowed dir


def test_vendor_edits_mount_the_files_and_no_neuwaredirectory(root: Path) -> None:
    paths = DriverPaths(
        cambricon_files=CambriconDriverFiles(driver_root=str(root), libraries=("libcndev.so",))
    )
    edits = vendor_edits([mlu(0)], paths, vendor_specs=[])
    mounted = {m.container_path: m.host_path for m in edits.mounts}
    assert mounted["/usr/bin/cnmon"] == str(root / "usr/bin/cnmon")
    assert "/usr/local/neuware" not in mounted  # no whole directory by default
    assert dict(edits.env)["LD_LIBRARY_PATH"] == "/usr/local/neuware/lib64"  # now populated
    off = DriverPaths(cambricon_files=CambriconDriverFiles(driver_root=str(root), discover=False))
    assert vendor_edits([mlu(0)], off, vendor_specs=[]).mounts == ()


def test_nvidia_and_cambricon_use_their_own_lists(root: Path) -> None:
    fake_driver(root)  # both drivers on one host root: each vendor finds only its own files
    nvidia = driver_file_mounts(NvidiaDriverFiles(driver_root=str(root)))
    assert not any("cn" in os.path.basename(m.host_path) for m in nvidia)
    cambricon = mounts_of(CambriconDriverFiles(driver_root=str(root)))
    assert list(cambricon) == ["/usr/bin/cnmon"]


def test_an_unmounted_host_neuware_is_warned_of_once_naming_the_setting(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = CambriconDriverFiles(driver_root=str(root))
    caplog.set_level(logging.WARNING, logger="hcsd.runtime.vendors")
    vendor_edits([mlu(0)], DriverPaths(cambricon_files=files), vendor_specs=[])
    vendor_edits([mlu(1)], DriverPaths(cambricon_files=files), vendor_specs=[])
    warned = [r.getMessage() for r in caplog.records if "neuware" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "[runtime.driver_paths] cambricon = ['/usr/local/neuware']" in warned[0]
    caplog.clear()
    other = root.parent / "listed"  # a fresh host root: its own warning is not yet given
    directory(other / NEUWARE_LIB)
    listed = DriverPaths(
        cambricon=("/usr/local/neuware",),
        cambricon_files=CambriconDriverFiles(driver_root=str(other)),
    )
    vendor_edits([mlu(0)], listed, vendor_specs=[])
    assert not [r for r in caplog.records if "neuware" in r.getMessage()]
