"""The NVIDIA driver's files found through the ld.so cache of a fake host root, mounted file by
file and read-only; entries that point elsewhere, files not root's and broken caches; the
Ascend driver's files from Ascend Docker Runtime's mount list."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from hcsd.model import Vendor
from hcsd.runtime.ascend_files import MAX_ENTRIES, ascend_list_mounts
from hcsd.runtime.driver_files import driver_file_mounts
from hcsd.runtime.driver_settings import AscendDriverFiles, LibraryPaths, NvidiaDriverFiles
from hcsd.runtime.ldcache import FLAG_ELF_LIBC6, NEW_MAGIC, host_arch_flags
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendors import vendor_edits
from tests.conftest import gpu
from tests.harness.fake_driver import LIB_DIR, VERSION, fake_driver, shared_object, update_cache
from tests.nri.test_vendor_cdi import NVIDIA_SPEC

INSIDE = "/usr/local/nvidia/lib64"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("hcsd mounts only root's files: the fake driver is root's only as root")
    root = tmp_path / "host"
    fake_driver(root)
    return root


def mounts_of(root: Path, **settings: object) -> dict[str, str]:
    """container path -> host path of the mounts found under `root`."""
    found = driver_file_mounts(NvidiaDriverFiles(driver_root=str(root), **settings))  # type: ignore[arg-type]
    assert all(m.read_only for m in found)
    return {m.container_path: m.host_path for m in found}


def test_libraries_tools_and_firmware_are_found(root: Path) -> None:
    mounts = mounts_of(root)
    real = str(root / LIB_DIR / f"libcuda.so.{VERSION}")
    assert mounts[f"{INSIDE}/libcuda.so.{VERSION}"] == real
    assert mounts[f"{INSIDE}/libcuda.so.1"] == real  # the soname, to the real file
    assert mounts[f"{INSIDE}/libnvidia-ml.so.1"] == str(
        root / LIB_DIR / f"libnvidia-ml.so.{VERSION}"
    )
    assert f"{INSIDE}/libnvidia-ptxjitcompiler.so.1" in mounts
    assert mounts["/usr/bin/nvidia-smi"] == str(root / "usr/bin/nvidia-smi")
    assert mounts[f"/lib/firmware/nvidia/{VERSION}"] == str(root / f"lib/firmware/nvidia/{VERSION}")
    assert len(mounts) == 8


def test_the_container_library_dir_and_the_switches(root: Path) -> None:
    assert "/usr/lib64/libcuda.so.1" in mounts_of(root, container_library_dir="/usr/lib64")
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" not in mounts_of(root)
    assert not any("firmware" in p for p in mounts_of(root, firmware=False))
    assert mounts_of(root, discover=False) == {}


def test_without_a_vendor_spec_vendor_edits_mount_the_files(root: Path, tmp_path: Path) -> None:
    paths = DriverPaths(nvidia=(), nvidia_files=NvidiaDriverFiles(driver_root=str(root)))
    edits = vendor_edits([gpu(0)], paths, vendor_specs=[str(tmp_path / "none*.yaml")])
    assert f"{INSIDE}/libcuda.so.1" in {m.container_path for m in edits.mounts}
    assert dict(edits.env)["LD_LIBRARY_PATH"] == INSIDE  # hcsd's directory, now populated
    (tmp_path / "nvidia.yaml").write_text(NVIDIA_SPEC)  # the vendor's spec wins
    edits = vendor_edits([gpu(0)], paths, vendor_specs=[str(tmp_path / "nvidia*.yaml")])
    assert f"{INSIDE}/libcuda.so.1" not in {m.container_path for m in edits.mounts}


def test_library_path_lists_only_directories_something_is_mounted_in(
    root: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "lib-on-the-host"  # exists on the host, but nothing mounts it
    empty.mkdir()
    paths = DriverPaths(
        nvidia=(),
        nvidia_files=NvidiaDriverFiles(driver_root=str(root), discover=False),
        library_path=LibraryPaths(nvidia=(str(empty), INSIDE)),
    )
    edits = vendor_edits([gpu(0)], paths, vendor_specs=[])
    assert "LD_LIBRARY_PATH" not in dict(edits.env)
    paths = DriverPaths(nvidia=(str(tmp_path),), library_path=LibraryPaths(nvidia=(str(empty),)))
    edits = vendor_edits([gpu(0)], paths, vendor_specs=[])  # inside a mounted driver directory
    assert dict(edits.env)["LD_LIBRARY_PATH"] == str(empty)


def test_an_entry_leading_outside_the_library_dirs_is_skipped(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A cache listing a library in /etc, and a soname link turned to a file elsewhere
    (root / "etc/evil").mkdir(mode=0o755)
    (root / "etc/evil").chmod(0o755)  # whatever the umask
    shared_object(root / "etc/evil/libcuda.so.999", "libcuda.so.2")
    (root / "srv").mkdir()
    (root / "srv").chmod(0o755)
    (root / "srv/secret").write_text("root's secret\n")
    update_cache(root, LIB_DIR, "etc/evil")
    link = root / LIB_DIR / "libnvidia-ml.so.1"
    link.unlink()
    link.symlink_to("../../../srv/secret")
    mounts = mounts_of(root)
    assert not any("evil" in h or "secret" in h for h in mounts.values())
    assert f"{INSIDE}/libnvidia-ml.so.1" not in mounts and f"{INSIDE}/libcuda.so.1" in mounts
    assert "outside the allowed directories" in caplog.text


def hand_built_cache(entries: list[tuple[str, str]]) -> bytes:
    """A glibc-ld.so.cache1.1 file listing (name, path) pairs for this machine's libc6 ABI."""
    flags = FLAG_ELF_LIBC6 | (host_arch_flags() or 0)
    strings_at = 48 + 24 * len(entries)
    table, rows = b"", b""
    for name, path in entries:
        key = strings_at + len(table)
        table += name.encode() + b"\0"
        rows += struct.pack("<iIIIQ", flags, key, strings_at + len(table), 0, 0)
        table += path.encode() + b"\0"
    header = struct.pack("<20sIIB3xI12x", NEW_MAGIC, len(entries), len(table), 2, 0)
    return header + rows + table


@pytest.mark.parametrize(
    "name",
    ["libcuda.so./../../../etc/ld.so.preload", "libcuda.so.1\nWARNING forged", "libcuda.so.1 x"],
)
def test_a_cache_name_that_is_not_a_plain_soname_is_refused(
    root: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    real = f"/{LIB_DIR}/libcuda.so.{VERSION}"
    (root / "etc/ld.so.cache").write_bytes(
        hand_built_cache([(name, real), ("libnvidia-ml.so.1", f"/{LIB_DIR}/libnvidia-ml.so.1")])
    )
    mounts = mounts_of(root)
    assert not any("libcuda" in p or "preload" in p for p in mounts)
    assert f"{INSIDE}/libnvidia-ml.so.1" in mounts
    assert repr(name) in caplog.text and "\nWARNING forged" not in caplog.text


def test_an_absolute_link_does_not_leave_the_driver_root(root: Path) -> None:
    link = root / LIB_DIR / "libnvidia-ml.so.1"
    link.unlink()
    link.symlink_to("/etc/passwd")
    assert f"{INSIDE}/libnvidia-ml.so.1" not in mounts_of(root)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: os.chown(p, 1000, 1000), id="not-roots"),
        pytest.param(lambda p: p.chmod(0o775), id="group-writable"),
    ],
)
def test_a_file_root_does_not_own_alone_is_skipped(root: Path, change: object) -> None:
    if os.geteuid() != 0:
        pytest.skip("the files must be root's to begin with")
    change(root / LIB_DIR / f"libcuda.so.{VERSION}")  # type: ignore[operator]
    mounts = mounts_of(root)
    assert not any("libcuda" in p for p in mounts) and f"{INSIDE}/libnvidia-ml.so.1" in mounts


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda root: (root / "usr/lib").chmod(0o777), id="world-writable-parent"),
        pytest.param(lambda root: os.chown(root / LIB_DIR, 1000, 1000), id="parent-not-roots"),
        pytest.param(
            lambda root: os.lchown(root / LIB_DIR / "libcuda.so.1", 1000, 1000), id="link-not-roots"
        ),
    ],
)
def test_a_directory_or_link_on_the_way_others_control_is_refused(
    root: Path, caplog: pytest.LogCaptureFixture, change: object
) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing the owner of the fake driver's directories needs root")
    change(root)  # type: ignore[operator]
    mounts = mounts_of(root)
    assert f"{INSIDE}/libcuda.so.1" not in mounts and "/usr/bin/nvidia-smi" in mounts
    assert "libcuda.so.1" in caplog.text and "root" in caplog.text


def test_firmware_must_stay_under_lib_firmware(root: Path) -> None:
    firmware = root / f"lib/firmware/nvidia/{VERSION}"
    firmware.rename(root / "lib/firmware/moved")
    firmware.symlink_to("../../../etc")
    assert not any("firmware" in p for p in mounts_of(root))
    firmware.unlink()
    firmware.symlink_to("../moved")  # elsewhere under /lib/firmware is fine
    update_cache(root)  # seen after the next ldconfig, as a driver install runs it
    assert mounts_of(root)[f"/lib/firmware/nvidia/{VERSION}"] == str(root / "lib/firmware/moved")


def test_a_kept_answer_checks_its_files_again(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing owners needs root")
    assert f"{INSIDE}/libcuda.so.1" in mounts_of(root)
    os.chown(root / LIB_DIR, 1000, 1000)  # no cache change: the kept answer is checked again
    assert not any("libcuda" in p for p in mounts_of(root))


def test_a_refused_tool_does_not_hide_the_next_directorys(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the tools must be root's to begin with")
    (root / "usr/local/bin").mkdir(parents=True)
    for d in (root / "usr/local", root / "usr/local/bin"):
        d.chmod(0o755)
    (root / "usr/local/bin/nvidia-smi").write_text("#!/bin/sh\n")
    os.chown(root / "usr/local/bin/nvidia-smi", 1000, 1000)
    assert mounts_of(root)["/usr/bin/nvidia-smi"] == str(root / "usr/bin/nvidia-smi")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:60], id="truncated"),
        pytest.param(lambda data: b"\xff" * len(data), id="garbage"),
        pytest.param(lambda data: data[:20] + b"\xff\xff\xff\x7f" + data[24:], id="count"),
    ],
)
def test_a_corrupt_cache_mounts_no_library_and_says_so(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    cache = root / "etc/ld.so.cache"
    cache.write_bytes(damage(cache.read_bytes()))  # type: ignore[operator]
    paths = DriverPaths(nvidia=(), nvidia_files=NvidiaDriverFiles(driver_root=str(root)))
    edits = vendor_edits([gpu(0)], paths, vendor_specs=[str(tmp_path / "none*.yaml")])
    assert not any(".so" in m.container_path for m in edits.mounts)
    assert dict(edits.env)["CUDA_VISIBLE_DEVICES"] == "dev-0"  # the container still gets its GPU
    assert "failed to read the ld.so cache" in caplog.text
    assert "no NVIDIA driver libraries are mounted" in caplog.text


def ascend_list(tmp_path: Path, *entries: str) -> Path:
    listed = tmp_path / "base.list"
    listed.write_text("".join(f"{e}\n" for e in entries))
    listed.chmod(0o644)
    return listed


def test_the_ascend_mount_list_is_mounted_as_its_runtime_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the listed files must be root's")
    driver = tmp_path / "Ascend/driver/lib64"
    driver.mkdir(parents=True)
    for d in (driver, driver.parent, driver.parent.parent):
        d.chmod(0o755)  # whatever the umask
    smi = tmp_path / "npu-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    theirs = tmp_path / "not-roots"
    theirs.write_text("x")
    os.chown(theirs, 1000, 1000)
    listed = ascend_list(
        tmp_path,
        "# the driver",
        str(driver),
        str(smi),
        str(theirs),
        "relative/x",
        f"{tmp_path}/../escape",
        str(tmp_path / "absent"),
        "",
    )
    files = AscendDriverFiles(mount_list=str(listed), allowed=(f"{tmp_path}/",))
    paths = DriverPaths(ascend=(), ascend_files=files)
    edits = vendor_edits([gpu(0, vendor=Vendor.ASCEND)], paths, vendor_specs=[])
    assert {(m.host_path, m.container_path) for m in edits.mounts} == {
        (str(driver), str(driver)),
        (str(smi), str(smi)),
    }
    assert all(m.read_only for m in edits.mounts)
    assert "not root's alone" in caplog.text and "not a plain absolute path" in caplog.text
    assert ascend_list_mounts(AscendDriverFiles(mount_list=str(listed))) == []  # the default
    assert "outside the allowed paths" in caplog.text


def test_an_ascend_list_cannot_mount_system_directories(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the list must be root's")
    system = ("/", "/etc", "/root", "/proc", "/sys", "/dev", "/run", "/var/lib", "/usr")
    listed = ascend_list(tmp_path, *system, "/etc/hostname")
    mounts = ascend_list_mounts(AscendDriverFiles(mount_list=str(listed), allowed=("/",)))
    assert [m.container_path for m in mounts] == ["/etc/hostname"]  # a regular file may be
    assert "'/etc': /etc is a system directory" in caplog.text
    assert ascend_list_mounts(AscendDriverFiles(mount_list=str(listed))) == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d.chmod(0o777), id="world-writable-parent"),
        pytest.param(lambda d: os.chown(d, 1000, 1000), id="parent-not-roots"),
    ],
)
def test_an_ascend_entry_under_a_directory_others_control_is_refused(
    tmp_path: Path, change: object
) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing owners needs root")
    parent = tmp_path / "Ascend"
    (parent / "driver/lib64").mkdir(parents=True)
    for d in (parent, parent / "driver", parent / "driver/lib64"):
        d.chmod(0o755)
    listed = ascend_list(tmp_path, str(parent / "driver/lib64"))
    files = AscendDriverFiles(mount_list=str(listed), allowed=(f"{tmp_path}/",))
    assert len(ascend_list_mounts(files)) == 1
    change(parent)  # type: ignore[operator]
    assert ascend_list_mounts(files) == []


def test_an_ascend_list_too_long_or_behind_a_foreign_link_is_refused_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the list must be root's")
    driver = tmp_path / "lib64"
    driver.mkdir()
    driver.chmod(0o755)
    listed = ascend_list(tmp_path, str(driver), *["# padding"] * MAX_ENTRIES)
    files = AscendDriverFiles(mount_list=str(listed), allowed=(f"{tmp_path}/",))
    assert ascend_list_mounts(files) == []
    assert f"more than {MAX_ENTRIES} lines" in caplog.text
    listed = ascend_list(tmp_path, str(driver))
    link = tmp_path / "link.list"
    link.symlink_to(listed)
    files = AscendDriverFiles(mount_list=str(link), allowed=(f"{tmp_path}/",))
    assert len(ascend_list_mounts(files)) == 1  # root's link to root's list
    os.lchown(link, 1000, 1000)
    assert ascend_list_mounts(files) == []


def test_an_ascend_mount_list_others_may_write_is_ignored(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the list must be root's to begin with")
    driver = tmp_path / "lib64"
    driver.mkdir()
    driver.chmod(0o755)
    listed = ascend_list(tmp_path, str(driver))
    assert (
        ascend_list_mounts(AscendDriverFiles(mount_list=str(listed), allowed=(f"{tmp_path}/",)))
        != []
    )
    listed.chmod(0o666)
    assert (
        ascend_list_mounts(AscendDriverFiles(mount_list=str(listed), allowed=(f"{tmp_path}/",)))
        == []
    )
    assert ascend_list_mounts(AscendDriverFiles(mount_list="")) == []
