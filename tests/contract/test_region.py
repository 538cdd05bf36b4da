"""usage.shm: the region hcsd writes is the one libhcs's own code accepts, byte for byte.

`libhcs/build/hcs-region` is built from libhcs's format code (src/region.c): `init` writes an
initialised empty region, `check` says whether libhcs would map a file. hcsd.contract.region
must write exactly `init`'s bytes and refuse what `check` refuses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hcsd.contract import region

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hcs_region() -> Path:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and cc are needed to build libhcs's hcs-region")
    subprocess.run(["make", "-s", "-C", str(ROOT / "libhcs")], check=True, capture_output=True)
    return ROOT / "libhcs" / "build" / "hcs-region"


def check(tool: Path, path: Path) -> tuple[bool, str]:
    result = subprocess.run(
        [str(tool), "check", str(path)], check=False, capture_output=True, text=True
    )
    assert result.returncode in (0, 1), result.stderr
    return result.returncode == 0, result.stderr.strip()


def test_the_empty_region_is_what_libhcs_writes(hcs_region: Path, tmp_path: Path) -> None:
    subprocess.run([str(hcs_region), "init", str(tmp_path / "init.shm")], check=True)
    assert (tmp_path / "init.shm").read_bytes() == region.empty_region()
    ours = tmp_path / "ours.shm"
    ours.write_bytes(region.empty_region())
    assert check(hcs_region, ours) == (True, "")
    assert region.problem(region.empty_region()) is None


def test_the_header_is_the_one_the_abi_header_prints() -> None:
    """hcs_abi.h lists the 32 header bytes of an initialised region in its comment."""
    text = (ROOT / "libhcs" / "include" / "hcs_abi.h").read_text()
    lines = re.findall(r"^ \*\s+((?:[0-9a-f]{2} ){15}[0-9a-f]{2})$", text, re.MULTILINE)
    assert len(lines) == 2, lines
    assert bytes.fromhex(" ".join(lines)) == region.header()


def damaged() -> list[object]:
    cases: list[object] = []
    for offset in range(region.HEADER_SIZE):
        data = bytearray(region.empty_region())
        data[offset] ^= 0x01
        cases.append(pytest.param(bytes(data), id=f"header-byte-{offset}"))
    lock = bytearray(region.empty_region())
    lock[region.LOCK_STATE_OFFSET : region.LOCK_STATE_OFFSET + 4] = (-2).to_bytes(
        4, "little", signed=True
    )
    cases += [
        pytest.param(bytes(lock), id="lock-state"),
        pytest.param(region.empty_region()[:-1], id="short"),
        pytest.param(region.empty_region() + b"\0", id="long"),
        pytest.param(b"", id="empty"),
    ]
    return cases


@pytest.mark.parametrize("data", damaged())
def test_what_libhcs_refuses_is_refused(hcs_region: Path, tmp_path: Path, data: bytes) -> None:
    """hcsd keeps a usable region on a second prepare and replaces any other: it must judge
    a region as libhcs does, or it would keep one libhcs refuses (every allocation failing)."""
    path = tmp_path / "usage.shm"
    path.write_bytes(data)
    accepted, why = check(hcs_region, path)
    assert not accepted and why
    assert region.problem(data) is not None


def test_used_counters_do_not_make_a_region_unusable(hcs_region: Path, tmp_path: Path) -> None:
    data = bytearray(region.empty_region())
    data[region.USED_OFFSET : region.USED_OFFSET + 8] = (3 << 30).to_bytes(8, "little")
    data[region.LOCK_STATE_OFFSET : region.LOCK_STATE_OFFSET + 4] = (-1).to_bytes(
        4, "little", signed=True
    )
    path = tmp_path / "usage.shm"
    path.write_bytes(data)
    assert check(hcs_region, path)[0] and region.problem(bytes(data)) is None
