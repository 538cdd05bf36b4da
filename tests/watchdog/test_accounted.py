"""libhcs's own figure from its usage region, read from a directory the container controls."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from hcsd.watchdog.accounted import MAGIC, AccountedUsage
from tests.watchdog.conftest import UUIDS, GiB, allocation

CID = "c" * 64


def region(used: list[int], *, magic: int = MAGIC, version: int = 1, slots: int = 16) -> bytes:
    header = struct.pack("<QIIIIQ", magic, version, slots, 256, 0, 3)
    return header + struct.pack("<16Q", *(used + [0] * 16)[:16])


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "containers" / CID
    path.mkdir(parents=True)
    return path


def test_used_per_device_in_grant_order(tmp_path: Path, directory: Path) -> None:
    (directory / "usage.shm").write_bytes(region([5 * GiB, 7 * GiB]) + b"\0" * 35040)
    held = allocation(CID, {1: 8 * GiB, 0: 8 * GiB})  # ordinal 0 is the first grant: GPU 1
    assert AccountedUsage(tmp_path)(held) == {UUIDS[1]: 5 * GiB, UUIDS[0]: 7 * GiB}


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda d: None, id="missing"),
        pytest.param(lambda d: (d / "usage.shm").write_bytes(region([1], magic=1)), id="foreign"),
        pytest.param(lambda d: (d / "usage.shm").write_bytes(region([1], slots=0)), id="no-slots"),
        pytest.param(lambda d: (d / "usage.shm").write_bytes(region([1])[:40]), id="truncated"),
        pytest.param(
            lambda d: (d / "usage.shm").symlink_to("/etc/passwd"), id="symlink-not-followed"
        ),
        pytest.param(lambda d: os.mkfifo(d / "usage.shm"), id="fifo-never-opened"),
        pytest.param(lambda d: (d / "usage.shm").mkdir(), id="directory"),
    ],
)
def test_anything_but_a_region_reads_as_unknown(tmp_path: Path, directory: Path, make) -> None:  # type: ignore[no-untyped-def]
    make(directory)
    assert AccountedUsage(tmp_path)(allocation(CID, {0: GiB})) is None


def test_a_device_node_planted_there_is_never_opened(tmp_path: Path, directory: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("NOT ROOT: cannot make a device node")
    # /dev/full's numbers: opening it is harmless, but a container could plant worse.
    os.mknod(directory / "usage.shm", 0o600 | stat.S_IFCHR, os.makedev(1, 7))
    assert AccountedUsage(tmp_path)(allocation(CID, {0: GiB})) is None


def test_unsafe_container_ids_are_not_paths(tmp_path: Path) -> None:
    assert AccountedUsage(tmp_path)(allocation("../../etc", {0: GiB})) is None
