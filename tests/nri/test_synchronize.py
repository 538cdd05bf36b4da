"""Synchronize over a socketpair: each front end reconciles only its own allocations, each
session collects its own chunks, containers running without hcsd's edits are found; and
CreateContainer calls that come close to the runtime's timeout are reported."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from hcsd.contract import paths
from hcsd.daemon.metrics import render_metrics
from hcsd.discovery import Inventory
from hcsd.model import Allocation, FrontEnd, Grant, PodRef
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from tests.harness.local import DiskFull
from tests.nri.test_plugin import (
    A100_0,
    GiB,
    Setup,
    assignment,
    connect,
    container_request,
    plugin_setup,
)

POD = api.PodSandbox(id="sandbox-1", name="trainer", namespace="team-a", uid="pod-uid-1")


def held(setup: Setup, cid: str, front_end: FrontEnd, source: str = "local") -> None:
    pod = PodRef("team-a", "trainer", "pod-uid-1")
    grants = (Grant(A100_0, GiB),)
    setup.service.hold(Allocation(cid, grants, pod, "main", source=source, front_end=front_end))


async def synchronize(
    setup: Setup, *containers: api.Container, pods: tuple[api.PodSandbox, ...] = (POD,)
) -> None:
    await setup.peer.call(
        "Synchronize",
        api.SynchronizeRequest(pods=pods, containers=containers),
        api.SynchronizeResponse,
    )


def running(cid: str, name: str = "main", **fields: object) -> api.Container:
    return api.Container(
        id=cid, pod_sandbox_id=POD.id, name=name, state=api.CONTAINER_RUNNING, **fields
    )


async def test_synchronize_releases_only_what_nri_recorded(
    nri: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Containers of another runtime (hcs-runtime, hcs-oci-hook) and records from before the
    front end was kept are not in this runtime's list, and must keep their allocations."""
    held(nri, "by-wrapper", FrontEnd.RUNC_WRAPPER)
    held(nri, "by-hook", FrontEnd.OCI_HOOK)
    held(nri, "old-record", FrontEnd.UNKNOWN)
    wrapper_dir = nri.run_dir / "containers" / "by-wrapper"
    wrapper_dir.mkdir(parents=True)
    with caplog.at_level(logging.INFO):
        await synchronize(nri)
    assert nri.service.allocation("gone-container") is None  # NRI's own: released
    kept = {a.container_id: a.front_end for a in nri.service.allocations()}
    assert kept == {
        "by-wrapper": FrontEnd.RUNC_WRAPPER,
        "by-hook": FrontEnd.OCI_HOOK,
        "old-record": FrontEnd.UNKNOWN,
    }
    assert wrapper_dir.is_dir()  # its quota directory stays too
    assert "left 1 allocation(s) recorded before hcsd kept their front end" in caplog.text
    assert "old-record (release each with `hcsctl release ID`" in caplog.text


async def test_each_session_collects_its_own_chunks(nri: Setup) -> None:
    """Two runtime connections (the socket and the pre-launched relay) synchronizing at once:
    one's partial list must not end up in the other's reconcile."""
    held(nri, "a", FrontEnd.NRI)
    held(nri, "b", FrontEnd.NRI)
    a, b = (running(cid, mounts=quota_mounts(nri, cid)) for cid in ("a", "b"))
    second, session = await connect(nri.plugin)
    try:
        await nri.peer.call(
            "Synchronize",
            api.SynchronizeRequest(containers=[a, b], more=True),
            api.SynchronizeResponse,
        )
        await synchronize_from(second, b)  # this runtime has b only
        assert nri.service.allocation("a") is None
        await nri.peer.call(
            "Synchronize", api.SynchronizeRequest(more=False), api.SynchronizeResponse
        )  # the first runtime's list, a and b, completes: b is running there
        assert nri.service.allocation("b") is not None
    finally:
        second.close()
        await session


async def synchronize_from(peer: object, *containers: api.Container) -> None:
    await peer.call(  # type: ignore[attr-defined]
        "Synchronize", api.SynchronizeRequest(containers=containers), api.SynchronizeResponse
    )


def quota_mounts(setup: Setup, cid: str) -> list[api.Mount]:
    """hcsd's preload file over /etc/ld.so.preload and the container's own quota file at
    /run/hcs/quota.conf: what a container hcsd's edits reached has."""
    return [
        api.Mount(destination=paths.PRELOAD_FILE, source=str(setup.run_dir / "ld.so.preload")),
        api.Mount(
            destination=paths.CONTAINER_QUOTA_FILE,
            source=str(setup.run_dir / "containers" / cid / "quota.conf"),
        ),
    ]


async def test_containers_running_without_their_edits_are_released_counted_and_logged(
    nri: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    held(nri, "late", FrontEnd.NRI)  # answered, but the runtime had given up waiting
    (nri.run_dir / "containers" / "late").mkdir(parents=True)
    held(nri, "fine", FrontEnd.NRI)
    held(nri, "wrapped", FrontEnd.RUNC_WRAPPER)  # its edits went into config.json, not NRI's view
    sidecar_pod = api.PodSandbox(
        id="sandbox-2",
        name="trainer",
        namespace="team-b",
        uid="pod-uid-1",
        annotations={"hcs.io/assignment": assignment()},
    )
    with caplog.at_level(logging.WARNING):
        await synchronize(
            nri,
            running("late", name="late"),
            running("missed", name="missed", annotations={"hcs.io/vram": "8Gi"}),
            running("fine", name="fine", mounts=quota_mounts(nri, "fine")),
            running("plain", name="plain"),
            running("wrapped", name="wrapped"),
            api.Container(
                id="sidecar",
                pod_sandbox_id="sandbox-2",
                name="sidecar",
                state=api.CONTAINER_RUNNING,
            ),
            api.Container(
                id="stopped",
                pod_sandbox_id=POD.id,
                name="stopped",
                state=api.CONTAINER_STOPPED,
                annotations={"hcs.io/vram": "8Gi"},
            ),
            pods=(POD, sidecar_pod),
        )
    assert nri.service.allocation("late") is None
    assert not (nri.run_dir / "containers" / "late").exists()
    assert {a.container_id for a in nri.service.allocations()} == {"fine", "wrapped"}
    assert nri.service.uninjected_count == 2
    assert "hcs_uninjected_containers_total 2.0" in render_metrics(nri.service)
    lines = [r.getMessage() for r in caplog.records if "runs without hcsd's" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("team-a/trainer/late: asked for devices but runs without hcsd's")
    assert "a request past its timeout); released what hcsd held for it" in lines[0]
    assert lines[1].startswith("team-a/trainer/missed: asked for devices")
    assert "created while hcsd was not registered with the runtime" in lines[1]
    assert "recreate it (delete the pod or container)" in lines[1]


class SlowDisk(DiskFull):
    """fdatasync that takes `delay` seconds on the test's clock."""

    def __init__(self, now: list[float]) -> None:
        super().__init__()
        self.now = now
        self.delay = 0.0

    def sync(self, fd: int) -> None:
        super().sync(fd)
        self.now[0] += self.delay


@pytest.mark.parametrize(("delay", "warned"), [(0.01, False), (1.5, True)])
async def test_a_create_close_to_the_runtime_timeout_is_reported(
    tmp_path: Path,
    mixed_inventory: Inventory,
    caplog: pytest.LogCaptureFixture,
    delay: float,
    warned: bool,
) -> None:
    now = [time.perf_counter()]
    disk = SlowDisk(now)
    async with plugin_setup(tmp_path, mixed_inventory, disk=disk, clock=lambda: now[0]) as nri:
        await nri.peer.call(
            "Configure",
            api.ConfigureRequest(NRI_version="v0.12.0", request_timeout=2000),
            api.ConfigureResponse,
        )
        disk.delay = delay
        with caplog.at_level(logging.WARNING):
            await nri.peer.call(
                "CreateContainer",
                container_request("slow", annotations={"hcs.io/vram": "1Gi"}),
                api.CreateContainerResponse,
            )
    assert nri.plugin.create_seconds[-1] == pytest.approx(delay)
    expected = (
        f"team-a/trainer/main: CreateContainer took {delay:.2f} s in hcsd (the runtime waits "
        "2000 ms)"
    )
    assert (expected in caplog.text) is warned


async def test_the_preload_alone_is_not_hcsds_edits(nri: Setup) -> None:
    """A container of hcsd's CDI spec has the preload file and no quota file: one that asked
    for devices (created while hcsd was down, with the CDI name added) runs without a quota."""
    await synchronize(
        nri,
        running(
            "cdi",
            name="cdi",
            annotations={"hcs.io/vram": "8Gi"},
            mounts=quota_mounts(nri, "cdi")[:1],  # the preload only
        ),
        running(
            "whole",
            name="whole",
            annotations={"hcs.io/vram": "8Gi"},
            mounts=quota_mounts(nri, "whole"),
        ),
    )
    assert nri.service.uninjected_count == 1
