"""Checkpoint resume through the plugin: the container's mounts as the runtime sends them in
CreateContainer, HCS_RESUME_FROM in the adjustment (tests/runtime/test_resume_containerd.py
runs the same with a real containerd and reads it inside the container)."""

from __future__ import annotations

from pathlib import Path

from hcsd.runtime.nri.adjust import bind_mounts
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.runtime.resume import BindMount
from tests.nri.test_plugin import Setup, container_request


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


def test_the_bind_mounts_of_a_request(tmp_path: Path) -> None:
    container = api.Container(mounts=kubelet_mounts(tmp_path))
    assert bind_mounts(container) == (
        BindMount("/dev/shm", "/run/shm"),
        BindMount("/etc/hosts", "/etc/hosts"),
        BindMount("/ckpt", str(tmp_path)),
    )


async def test_create_container_gets_the_newest_complete_checkpoint(
    nri: Setup, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    for step, complete in ((1, True), (2, True), (3, False)):
        (volume / f"step-{step}").mkdir(parents=True)
        if complete:
            (volume / f"step-{step}" / "COMPLETE").write_text("")
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
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    reply = await nri.peer.call(
        "CreateContainer",
        container_request(
            "c2",
            pod_annotations={"hcs.io/checkpoint-path": "/ckpt"},
            mounts=kubelet_mounts(volume),
        ),
        api.CreateContainerResponse,
    )
    assert not reply.HasField("adjust")  # no devices asked for: hcsd does not look
