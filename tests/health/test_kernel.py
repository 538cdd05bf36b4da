"""Health watching on the real kernel: eBPF programs loaded, crafted lines in /dev/kmsg.

Each path (eBPF, bcc, /dev/kmsg polling) gets the same crafted lines. A path that cannot run
on this machine is skipped with the reason, never passed silently.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from hcsd.health.events import HealthEvent
from hcsd.health.sources.base import HealthSource, SourceUnavailable
from hcsd.health.sources.bcc import BccSource
from hcsd.health.sources.ebpf import EbpfSource
from hcsd.health.sources.kmsg import KmsgSource
from hcsd.health.watching import HealthWatcher, WatcherSettings
from hcsd.ledger import Ledger
from hcsd.model import HealthState, Request, Vendor
from hcsd.service import NodeService

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="kernel paths need root")

Write = Callable[..., None]


def crafted(tag: str) -> list[str]:
    return [
        f"NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus. {tag}",
        f"amdgpu 0000:81:00.0: amdgpu: GPU reset begin! {tag}",
        f"an unrelated line that must be filtered out {tag}",
        f"NVRM: Xid (PCI:0000:17:00): 13, Graphics Exception {tag}",
    ]


async def collect(source: HealthSource, write: Write, tag: str) -> list[HealthEvent]:
    got: list[HealthEvent] = []
    try:
        source.start(asyncio.get_running_loop(), got.append)
    except SourceUnavailable as e:
        pytest.skip(f"{source.name} source cannot run here: {e}")
    try:
        for line in crafted(tag):
            write(line)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and len([e for e in got if tag in e.message]) < 3:
            await asyncio.sleep(0.01)
    finally:
        stats = source.stats()
        source.stop()
    mine = [e for e in got if tag in e.message]
    assert [e.code for e in mine] == ["xid-79", "gpu-reset", "xid-13"], stats
    return mine


async def test_ebpf_source_sees_crafted_lines(bpf_objects: Path, kmsg_writer: Write) -> None:
    source = EbpfSource(str(bpf_objects))
    events = await collect(source, kmsg_writer, uuid.uuid4().hex)
    assert {e.source for e in events} == {"ebpf"}


async def test_ebpf_filters_in_the_kernel(bpf_objects: Path, kmsg_writer: Write) -> None:
    source = EbpfSource(str(bpf_objects))
    try:
        source.start(asyncio.get_running_loop(), lambda e: None)
    except SourceUnavailable as e:
        pytest.skip(f"eBPF cannot load here: {e}")
    try:
        before = source.stats()
        for i in range(50):
            kmsg_writer(f"boring line {i}")
        kmsg_writer("NVRM: Xid (PCI:0000:17:00): 48, DBE")
        await asyncio.sleep(0.1)
        after = source.stats()
    finally:
        source.stop()
    assert after["seen"] - before["seen"] >= 51
    assert after["matched"] - before["matched"] == 1  # only the candidate reached user space
    assert after["dropped"] == 0


async def test_kmsg_polling_source_sees_crafted_lines(kmsg_writer: Write) -> None:
    events = await collect(KmsgSource(), kmsg_writer, uuid.uuid4().hex)
    assert {e.source for e in events} == {"kmsg"}


async def test_bcc_source_sees_crafted_lines(kmsg_writer: Write) -> None:
    events = await collect(BccSource(), kmsg_writer, uuid.uuid4().hex)
    assert {e.source for e in events} == {"bcc"}


@pytest.mark.parametrize("source", ["ebpf", "kmsg"])
async def test_watcher_marks_the_device_unhealthy(
    source: str,
    bpf_objects: Path,
    kmsg_writer: Write,
    mixed_inventory: Inventory,
    tmp_path: Path,
) -> None:
    ledger = Ledger(str(tmp_path / "state"))
    ledger.open()
    service = NodeService(mixed_inventory, ledger)
    held, _, _ = service.allocate(
        Request("victim", vram_bytes=2**30, vendors=frozenset({Vendor.NVIDIA}))
    )
    target = next(s.device for s in service.devices() if s.device.pci_bus_id == "0000:17:00.0")
    watcher = HealthWatcher(
        service, WatcherSettings(source=source, bpf_dir=str(bpf_objects), sysfs=str(tmp_path))
    )
    assert watcher.start(asyncio.get_running_loop()) == source
    try:
        written = time.monotonic()
        kmsg_writer(f"NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus. {uuid.uuid4()}")
        while time.monotonic() - written < 2:
            status = service.device_status(target.uuid)
            assert status is not None
            if status.device.health_state is HealthState.UNHEALTHY:
                break
            await asyncio.sleep(0.002)
        detected = time.monotonic() - written
    finally:
        assert watcher.source is not None
        watcher.source.stop()
        ledger.close()
    status = service.device_status(target.uuid)
    assert status is not None and status.device.health_state is HealthState.UNHEALTHY
    assert status.device.health_score == 0
    assert detected < 0.5, f"{source}: detected after {detected * 1000:.0f} ms"
    assert held.device_uuids == (target.uuid,)  # the allocation is kept, and reported
    assert watcher.events[("nvidia", "xid-79", "fatal")] == 1
