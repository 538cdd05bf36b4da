"""The node's CDI spec: its content, how it is written, and how it follows device changes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import DeviceNode, Request, Vendor
from hcsd.runtime.cdi import CDI_KIND, SPEC_NAME, keep_spec_current, render_spec, write_spec
from hcsd.runtime.container_files import QuotaFiles
from hcsd.runtime.settings import DriverPaths
from hcsd.service import WATCH_QUEUE, NodeService
from tests.conftest import GiB, gpu

PATHS = DriverPaths()


def test_each_device_is_named_by_uuid_and_by_vendor_index() -> None:
    device = replace(
        gpu(3),
        device_nodes=(DeviceNode("/dev/nvidia3", 195, 3),),
        shared_nodes=(DeviceNode("/dev/nvidiactl", 195, 255),),
    )
    spec = render_spec([device], DriverPaths(nvidia=()))
    assert spec["kind"] == CDI_KIND and spec["cdiVersion"]
    entries = {e["name"]: e["containerEdits"] for e in spec["devices"]}
    assert list(entries) == ["dev-3", "nvidia-3"]
    assert entries["dev-3"] == entries["nvidia-3"]
    edits = entries["dev-3"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia3", "/dev/nvidiactl"]
    assert edits["deviceNodes"][0] == {
        "path": "/dev/nvidia3",
        "type": "c",
        "major": 195,
        "minor": 3,
        "permissions": "rw",
    }
    assert "NVIDIA_VISIBLE_DEVICES=dev-3" in edits["env"]


def test_the_spec_is_written_once_root_only_and_whole(tmp_path: Path) -> None:
    """CDI names are an operator interface (whole devices outside the ledger): only root, and
    so only root runtimes, may read the spec."""
    directory = tmp_path / "cdi"
    devices = [gpu(0), gpu(1, vendor=Vendor.HYGON, model="Z100")]
    assert write_spec(str(directory), devices, PATHS)
    path = directory / SPEC_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_uid == os.geteuid()
    assert json.loads(path.read_text()) == render_spec(devices, PATHS)
    inode = path.stat().st_ino
    assert not write_spec(str(directory), devices, PATHS)  # same content: not rewritten
    assert path.stat().st_ino == inode
    assert write_spec(str(directory), devices[:1], PATHS)
    assert [p.name for p in directory.iterdir()] == [SPEC_NAME]  # no temp file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_world_readable_spec_from_before_is_made_root_only(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"
    devices = [gpu(0)]
    write_spec(str(directory), devices, PATHS)
    path = directory / SPEC_NAME
    path.chmod(0o644)  # as an older hcsd left it
    assert not write_spec(str(directory), devices, PATHS)  # same content
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_every_device_carries_libhcs_and_the_preload(tmp_path: Path) -> None:
    quota = QuotaFiles(str(tmp_path / "run"), "/usr/lib/hcs/libhcs.so")
    spec = render_spec([gpu(0), gpu(1)], DriverPaths(nvidia=()), quota.preload_edits())
    preload = tmp_path / "run" / "ld.so.preload"
    assert preload.read_text() == "/usr/lib/hcs/libhcs.so\n"
    for entry in spec["devices"]:
        mounts = {m["containerPath"]: m for m in entry["containerEdits"]["mounts"]}
        assert mounts["/etc/ld.so.preload"]["hostPath"] == str(preload)
        assert mounts["/usr/lib/hcs/libhcs.so"]["hostPath"] == "/usr/lib/hcs/libhcs.so"
        assert all("ro" in m["options"] for m in mounts.values())


@pytest.fixture
def service(mixed_inventory: Inventory, ledger: Ledger) -> NodeService:
    return NodeService(mixed_inventory, ledger)


async def _until(condition: object, timeout: float = 2.0) -> None:
    async def wait() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


def _nodes(path: Path, name: str) -> list[str]:
    entries = {e["name"]: e for e in json.loads(path.read_text())["devices"]}
    return [n["path"] for n in entries[name]["containerEdits"]["deviceNodes"]]


async def test_a_watcher_that_fell_behind_catches_up_and_keeps_following(
    tmp_path: Path, service: NodeService
) -> None:
    """A burst larger than the watch queue (the loop busy elsewhere) cuts the spec's watcher
    off; the change inside the burst still lands, and so does one after it (resubscribed)."""
    directory = tmp_path / "cdi"
    path = directory / SPEC_NAME
    write_spec(str(directory), [s.device for s in service.devices()], PATHS)
    task = asyncio.create_task(keep_spec_current(str(directory), service, PATHS))
    await asyncio.sleep(0)
    device = service.devices()[0].device
    for i in range(WATCH_QUEUE // 2):  # 4 events each, no await: the queue overflows
        service.allocate(Request(f"c{i}", vram_bytes=GiB))
        service.release(f"c{i}")
    service.set_device(replace(device, device_nodes=(DeviceNode("/dev/nvidia9", 195, 9),)))
    await _until(lambda: "/dev/nvidia9" in _nodes(path, device.uuid))
    service.set_device(replace(device, device_nodes=(DeviceNode("/dev/nvidia6", 195, 6),)))
    await _until(lambda: "/dev/nvidia6" in _nodes(path, device.uuid))
    assert service.watcher_count == 1 and not task.done()
    task.cancel()


async def test_a_spec_that_cannot_be_written_is_reported_and_watching_goes_on(
    tmp_path: Path, service: NodeService, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "cdi"
    (directory / SPEC_NAME).mkdir(parents=True)  # a directory where the file belongs
    task = asyncio.create_task(keep_spec_current(str(directory), service, PATHS))
    await asyncio.sleep(0)
    device = service.devices()[0].device
    with caplog.at_level(logging.WARNING):
        service.set_device(replace(device, device_nodes=(DeviceNode("/dev/nvidia8", 195, 8),)))
        await _until(lambda: "cannot update the CDI spec" in caplog.text)
    (directory / SPEC_NAME).rmdir()
    service.set_device(replace(device, device_nodes=(DeviceNode("/dev/nvidia7", 195, 7),)))
    await _until((directory / SPEC_NAME).is_file)
    assert "/dev/nvidia7" in _nodes(directory / SPEC_NAME, device.uuid)
    assert not task.done()
    task.cancel()
