"""Checkpoint resume through the plugin: the container's mounts as the runtime sends them in
CreateContainer, HCS_RESUME_FROM and HCS_RESUME_STATUS in the adjustment
(tests/runtime/test_resume_containerd.py runs the same with a real containerd and reads them
inside the container)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from hcsd.runtime.checkpoints import CheckpointSection
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.nri.adjust import container_mounts
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.runtime.resume import Found, Resumes, newest_in
from tests.nri.test_plugin import Setup, container_request, plugin_setup


def kubelet_mounts(volume: Path) -> list[api.Mount]:
    """What containerd's CRI puts in a pod container's spec: the volume, /etc/hosts, and the
    mounts that are not host directories."""
    return [
        api.Mount(destination="/proc", type="proc", source="proc", options=["nosuid"]),
        api.Mount(destination="/dev/shm", type="bind", source="/run/shm", options=["rbind"]),
        api.Mount(destination="/etc/hosts", type="bind", source="/etc/hosts", options=["rbind"]),
        api.Mount(destination="/ckpt", type="bind", source=str(volume), options=["rbind", "rw"]),
        api.Mount(destination="/tmpfs", type="tmpfs", source="tmpfs", options=["nosuid"]),
    ]


def test_the_mounts_of_a_request(tmp_path: Path) -> None:
    """All of them: a mount other than a bind may cover the checkpoint directory."""
    container = api.Container(mounts=kubelet_mounts(tmp_path))
    assert container_mounts(container) == (
        ContainerMount("/proc", "proc", bind=False, kind="proc"),
        ContainerMount("/dev/shm", "/run/shm"),
        ContainerMount("/etc/hosts", "/etc/hosts"),
        ContainerMount("/ckpt", str(tmp_path)),
        ContainerMount("/tmpfs", "tmpfs", bind=False, kind="tmpfs"),
    )


class Recording:
    """The real scan, each call recorded (and, with `cost`, taking that long on the
    plugin's clock)."""

    def __init__(self, now: list[float] | None = None, cost: float = 0.0) -> None:
        self.sources: list[str] = []
        self.now = now
        self.cost = cost

    def __call__(
        self, source: str, below: str, shadowed: Collection[str], settings: CheckpointSection
    ) -> Found:
        self.sources.append(source)
        if self.now is not None:
            self.now[0] += self.cost
        return newest_in(source, below, shadowed, settings)


async def test_create_container_gets_the_newest_complete_checkpoint(
    nri: Setup, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    for step, complete in ((1, True), (2, True), (3, False)):
        (volume / f"step-{step}").mkdir(parents=True)
        if complete:
            (volume / f"step-{step}" / "COMPLETE").write_text("")
    scans = Recording()
    nri.plugin.injector.resumes = Resumes(CheckpointSection(), scan=scans)
    reply = await nri.peer.call(
        "CreateContainer",
        container_request(
            "c1",
            annotations={"hcs.io/vram": "8Gi"},
            pod_annotations={"hcs.io/checkpoint-path": "/ckpt"},
            mounts=kubelet_mounts(volume),
        ),
        api.CreateContainerResponse,
    )
    env = {kv.key: kv.value for kv in reply.adjust.env}
    assert env["HCS_RESUME_FROM"] == "/ckpt/step-2"
    assert env["HCS_RESUME_STATUS"] == "found"
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    assert scans.sources == [str(volume)]
    reply = await nri.peer.call(
        "CreateContainer",
        container_request(
            "c2",
            pod_annotations={"hcs.io/checkpoint-path": "/ckpt"},
            mounts=kubelet_mounts(volume),
        ),
        api.CreateContainerResponse,
    )
    assert not reply.HasField("adjust")
    assert scans.sources == [str(volume)]  # no devices asked for: hcsd did not look


async def test_a_slow_create_names_the_scan_when_it_was_the_cause(
    tmp_path: Path, mixed_inventory: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    async with plugin_setup(tmp_path / "node", mixed_inventory, clock=lambda: now[0]) as nri:
        nri.plugin.injector.resumes = Resumes(CheckpointSection(), scan=Recording(now, 1.2))
        with caplog.at_level(logging.WARNING):
            await nri.peer.call(
                "CreateContainer",
                container_request(
                    "slow",
                    annotations={"hcs.io/vram": "1Gi"},
                    pod_annotations={"hcs.io/checkpoint-path": "/ckpt"},
                    mounts=kubelet_mounts(tmp_path / "volume"),
                ),
                api.CreateContainerResponse,
            )
    assert "team-a/trainer/main: CreateContainer took 1.20 s in hcsd" in caplog.text
    assert "the checkpoint scan took 1.20 s of it (runtime.checkpoints.timeout)" in caplog.text
