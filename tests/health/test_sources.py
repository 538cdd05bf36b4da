"""Health sources over crafted inputs: /dev/kmsg records through a FIFO, fake AER sysfs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest

from hcsd.health.events import HealthEvent, Severity
from hcsd.health.sources.aer import AerPoller, read_total
from hcsd.health.sources.ebpf import KMSG_EVENT, RAS_EVENT, decode_ras
from hcsd.health.sources.kmsg import KmsgSource


async def test_kmsg_polling_source_over_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # keeps the FIFO open for the reader
    got: list[HealthEvent] = []
    source = KmsgSource(str(fifo))
    source.start(asyncio.get_running_loop(), got.append)
    try:
        records = [
            b"6,1,1,-;usb 1-1: new device\n",
            b"3,2,2,-;NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n",
            b"4,3,3,-;amdgpu 0000:81:00.0: amdgpu: GPU reset begin!\n",
            b"\xff\xfe garbage without a prefix NVRM: Xid\n",
        ]
        for record in records:
            os.write(writer, record)
            await asyncio.sleep(0.02)  # one record per read, as /dev/kmsg delivers them
        await asyncio.sleep(0.05)
    finally:
        source.stop()
        os.close(writer)
    assert [(e.code, e.bus_id, e.source) for e in got] == [
        ("xid-79", "0000:17:00.0", "kmsg"),
        ("gpu-reset", "0000:81:00.0", "kmsg"),
    ]
    assert source.stats()["seen"] == 4


def test_kmsg_missing_device_is_a_clear_error(tmp_path: Path) -> None:
    from hcsd.health.sources.base import SourceUnavailable

    with pytest.raises(SourceUnavailable, match=r"cannot read .*absent"):
        KmsgSource(str(tmp_path / "absent")).start(asyncio.new_event_loop(), print)


def write_aer(root: Path, bus: str, correctable: int, fatal: int) -> None:
    device = root / "bus" / "pci" / "devices" / bus
    device.mkdir(parents=True, exist_ok=True)
    (device / "aer_dev_correctable").write_text(
        f"RxErr 0\nBadTLP {correctable}\nBadDLLP 0\nTOTAL_ERR_COR {correctable}\n"
    )
    (device / "aer_dev_fatal").write_text(f"Undefined 0\nDLP {fatal}\nTOTAL_ERR_FATAL {fatal}\n")
    (device / "aer_dev_nonfatal").write_text("garbage that is not a counter\n")


def test_aer_counters_in_sysfs(tmp_path: Path) -> None:
    write_aer(tmp_path, "0000:81:00.0", correctable=3, fatal=0)
    poller = AerPoller(["0000:81:00.0", "0000:99:00.0"], sysfs=str(tmp_path), interval=5.0)
    got: list[HealthEvent] = []
    poller.poll(got.append)
    assert got == []  # the first poll only learns the baseline
    write_aer(tmp_path, "0000:81:00.0", correctable=5, fatal=1)
    poller.poll(got.append)
    assert [(e.code, e.severity) for e in got] == [
        ("aer-correctable", Severity.CORRECTABLE),
        ("aer-fatal", Severity.FATAL),
    ]
    assert read_total(str(tmp_path / "none"), "TOTAL_ERR_COR") is None


def test_ras_events_decode_defensively() -> None:
    aer = RAS_EVENT.pack(1, 1, 0x4000, 1, 1, b"0000:81:00.0")
    event = decode_ras(aer, 5.0)
    assert event is not None and (event.bus_id, event.severity) == ("0000:81:00.0", Severity.FATAL)
    assert decode_ras(aer[:10], 5.0) is None  # short
    assert decode_ras(RAS_EVENT.pack(1, 1, 0, 9, 1, b"x"), 5.0) is None  # unknown severity
    assert decode_ras(RAS_EVENT.pack(1, 7, 0, 0, 1, b"x"), 5.0) is None  # unknown kind
    memory = decode_ras(RAS_EVENT.pack(1, 2, 1, 0, 4, b""), 5.0)
    assert memory is not None and memory.bus_id == ""


def test_python_mirrors_match_the_c_layout() -> None:
    """bpf/layout.c prints sizeof/offsetof of the shared event structs as C sees them."""
    root = Path(__file__).resolve().parents[2] / "bpf"
    build = subprocess.run(
        ["make", "-s", "-C", str(root), "build/layout"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if build.returncode != 0:
        pytest.skip(f"cannot build bpf/build/layout: {build.stderr.strip()}")
    output = subprocess.run(
        [str(root / "build" / "layout")], capture_output=True, text=True, check=True
    ).stdout
    sizes = dict(re.findall(r"^(\w+) (\d+)", output, re.MULTILINE))
    assert int(sizes["hcs_kmsg_event"]) == KMSG_EVENT.size
    assert int(sizes["hcs_ras_event"]) == RAS_EVENT.size
    assert "msg=16" in output and "dev_name=24" in output
