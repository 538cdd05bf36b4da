"""quota.conf: what hcsd writes is what libhcs's own parser reads.

libhcs/tests/dump_config.c links the real parser (libhcs/src/config.c) and prints the table it
builds; every file here is written by hcsd.contract.quota_file and read by it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hcsd.contract.quota_file import (
    MAX_DEVICES,
    MAX_UUID_BYTES,
    MAX_VRAM_LIMIT,
    DeviceQuota,
    QuotaFileError,
    quotas_of,
    render,
    render_quota,
)
from hcsd.model import Grant, Vendor
from tests.conftest import GiB, gpu

ROOT = Path(__file__).resolve().parents[2]
Read = Callable[[str], tuple[bool, list[str]]]


@pytest.fixture(scope="module")
def dump_config() -> Path:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and cc are needed to build libhcs's parser")
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "libhcs" / "tests"), "dump_config"],
        check=True,
        capture_output=True,
    )
    return ROOT / "libhcs" / "build" / "tests" / "dump_config"


@pytest.fixture
def libhcs_reads(dump_config: Path, tmp_path: Path) -> Read:
    """(parsed, lines) as libhcs reads the text: its device table, or its reason."""

    def read(text: str) -> tuple[bool, list[str]]:
        path = tmp_path / "quota.conf"
        path.write_text(text)
        result = subprocess.run(
            [str(dump_config), str(path)], check=False, capture_output=True, text=True
        )
        assert result.returncode in (0, 1), result.stderr  # 2 would be the harness's fault
        return result.returncode == 0, result.stdout.splitlines()

    return read


def table(quotas: Sequence[DeviceQuota]) -> list[str]:
    """What dump_config prints for a file that says exactly `quotas`."""
    return [f"ok devices={len(quotas)}"] + [
        f"device {i} uuid={q.uuid} vram_limit={q.vram_limit} compute_percent={q.compute_percent}"
        for i, q in enumerate(quotas)
    ]


VENDORS = [v.value for v in Vendor]
CASES = {
    **{f"one-{vendor}": [DeviceQuota(f"{vendor}-0", vendor, 16 * GiB, 100)] for vendor in VENDORS},
    "smallest-values": [DeviceQuota("GPU-a", "nvidia", 1, 1)],
    "largest-values": [DeviceQuota("GPU-a", "nvidia", MAX_VRAM_LIMIT, 100)],
    "large-numbers": [
        DeviceQuota("GPU-a", "nvidia", 80 * GiB, 50),
        DeviceQuota("GPU-b", "nvidia", 2**50 + 3, 99),
        DeviceQuota("GPU-c", "nvidia", 10**19, 7),
    ],
    "longest-uuid": [DeviceQuota("G" * MAX_UUID_BYTES, "ascend", 32 * GiB, 100)],
    "uuid-with-equals": [DeviceQuota("MIG-GPU-a/1/0=x", "nvidia", GiB, 100)],
    "every-vendor": [
        DeviceQuota(f"dev-{i}", VENDORS[i % len(VENDORS)], (i + 1) * GiB, 10 + i)
        for i in range(len(VENDORS) * 2)
    ],
    "most-devices": [
        DeviceQuota(f"GPU-{i:02d}-" + "f" * 80, VENDORS[i % 4], GiB << (i % 20), 100 - i)
        for i in range(MAX_DEVICES)
    ],
    "no-devices": [],
}


@pytest.mark.parametrize("quotas", list(CASES.values()), ids=list(CASES))
def test_libhcs_reads_what_hcsd_writes(libhcs_reads: Read, quotas: list[DeviceQuota]) -> None:
    parsed, lines = libhcs_reads(render("0123abcd" * 16, quotas))
    assert parsed, lines
    assert lines == table(quotas)


def test_a_containers_grants_as_libhcs_reads_them(libhcs_reads: Read) -> None:
    devices = [gpu(0), gpu(1, vendor=Vendor.ASCEND, model="910B")]
    grants = [Grant("dev-0", 10 * GiB, 0), Grant("dev-1", 32 * GiB, 30)]
    text = render_quota("c1", grants, devices)
    assert text == (
        "# written by hcsd; read by libhcs\nversion=1\ncontainer=c1\ndevices=2\n"
        "device.0.uuid=dev-0\ndevice.0.vendor=nvidia\ndevice.0.vram_limit=10737418240\n"
        "device.0.compute_percent=100\n"
        "device.1.uuid=dev-1\ndevice.1.vendor=ascend\ndevice.1.vram_limit=34359738368\n"
        "device.1.compute_percent=30\n"
    )  # the format hcsd has always written
    parsed, lines = libhcs_reads(text)
    assert parsed and lines == table(quotas_of(grants, devices))
    assert lines[1].endswith("compute_percent=100")  # no reserved share: not throttled


def unchecked(quotas: Sequence[DeviceQuota], container: str = "c1") -> str:
    """The file as it would read without the writer's checks."""
    lines = ["version=1", f"container={container}", f"devices={len(quotas)}"]
    for i, q in enumerate(quotas):
        lines += [
            f"device.{i}.uuid={q.uuid}",
            f"device.{i}.vendor={q.vendor}",
            f"device.{i}.vram_limit={q.vram_limit}",
            f"device.{i}.compute_percent={q.compute_percent}",
        ]
    return "\n".join(lines) + "\n"


REFUSED = {
    "too-many-devices": [DeviceQuota(f"GPU-{i}", "nvidia", GiB) for i in range(MAX_DEVICES + 1)],
    "no-vram": [DeviceQuota("GPU-a", "nvidia", 0)],
    "vram-past-uint64": [DeviceQuota("GPU-a", "nvidia", MAX_VRAM_LIMIT + 1)],
    "no-compute": [DeviceQuota("GPU-a", "nvidia", GiB, 0)],
    "compute-over-100": [DeviceQuota("GPU-a", "nvidia", GiB, 101)],
    "uuid-cut-short": [DeviceQuota("G" * (MAX_UUID_BYTES + 1), "nvidia", GiB)],
    "uuid-with-a-newline": [DeviceQuota("GPU-a\ndevice.0.vram_limit=1", "nvidia", GiB)],
    "line-too-long": [DeviceQuota("GPU-a", "v" * 300, GiB)],
}


@pytest.mark.parametrize("quotas", list(REFUSED.values()), ids=list(REFUSED))
def test_the_writer_refuses_what_libhcs_would_not_read_as_written(
    libhcs_reads: Read, quotas: list[DeviceQuota]
) -> None:
    """libhcs runs a container whose file it cannot read without any quota: each file the
    writer refuses is one libhcs rejects or reads differently from what it says."""
    with pytest.raises(QuotaFileError):
        render("c1", quotas)
    parsed, lines = libhcs_reads(unchecked(quotas))
    assert not parsed or lines != table(quotas), lines


@pytest.mark.parametrize(
    "container", ["", "c1\nversion=2", "c 1 ", "\u00e9"], ids=["empty", "newline", "space", "utf8"]
)
def test_the_writer_refuses_container_ids_it_cannot_write(container: str) -> None:
    with pytest.raises(QuotaFileError, match="container id"):
        render(container, [])
