"""The files a container's libhcs reads, as CreateContainer leaves them: readable by any uid,
the usage region made by hcsd (byte for byte version 3's empty region) and owned by the user
the runtime says the container runs as."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from hcsd.contract import region
from hcsd.runtime import container_files
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from tests.harness.waiting import eventually
from tests.nri.test_plugin import Setup, container_request


async def create(nri: Setup, cid: str, **container: object) -> Path:
    await nri.peer.call(
        "CreateContainer",
        container_request(cid, annotations={"hcs.io/vram": "1Gi"}, **container),
        api.CreateContainerResponse,
    )
    return nri.run_dir / "containers" / cid


def mode_and_owner(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid


async def test_what_libhcs_reads_is_readable_by_every_uid(nri: Setup) -> None:
    """glibc skips an unreadable /etc/ld.so.preload silently: a non-root container would run
    without libhcs, with the whole device."""
    directory = await create(nri, "c1", user=api.User(uid=1000, gid=1000))
    assert mode_and_owner(nri.run_dir / "ld.so.preload") == (0o644, 0, 0)
    assert mode_and_owner(directory / "quota.conf") == (0o644, 0, 0)
    # No host directory is mounted; nobody but hcsd lists these.
    assert mode_and_owner(directory)[0] == mode_and_owner(directory.parent)[0] == 0o711


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        pytest.param({"user": api.User(uid=1000, gid=1000)}, (0o644, 1000, 1000), id="uid-1000"),
        pytest.param(
            {"user": api.User(uid=1000680000, gid=0)}, (0o644, 1000680000, 0), id="openshift"
        ),
        pytest.param({"user": api.User(uid=0, gid=0)}, (0o644, 0, 0), id="root"),
        # NRI before v0.12 carries no user: any uid may write it.
        pytest.param({}, (0o666, 0, 0), id="unknown"),
        # In a user namespace the ids are the container's; NRI does not carry the mapping.
        pytest.param(
            {
                "user": api.User(uid=1000, gid=1000),
                "linux": api.LinuxContainer(namespaces=[api.LinuxNamespace(type="user")]),
            },
            (0o666, 0, 0),
            id="user-namespace",
        ),
    ],
)
async def test_the_region_is_made_empty_for_the_containers_user(
    nri: Setup, container: dict[str, object], expected: tuple[int, int, int]
) -> None:
    directory = await create(nri, "c1", **container)
    assert (directory / "usage.shm").read_bytes() == region.empty_region()
    assert mode_and_owner(directory / "usage.shm") == expected


async def test_a_region_in_use_is_kept_and_a_damaged_one_replaced(nri: Setup) -> None:
    """Preparing a container again (its OCI hook after NRI, a same-id restart) must not reset
    the counters of processes that may be running; a region libhcs would refuse is made anew."""
    directory = await create(nri, "c1", user=api.User(uid=1000, gid=1000))
    used = bytearray(region.empty_region())
    used[region.USED_OFFSET : region.USED_OFFSET + 8] = (5 << 30).to_bytes(8, "little")
    (directory / "usage.shm").write_bytes(used)
    await create(nri, "c1", user=api.User(uid=1000, gid=1000))
    assert (directory / "usage.shm").read_bytes() == used
    used[0] ^= 0xFF  # the magic
    (directory / "usage.shm").write_bytes(used)
    await create(nri, "c1", user=api.User(uid=1000, gid=1000))
    assert (directory / "usage.shm").read_bytes() == region.empty_region()


async def test_stop_through_state_change_removes_the_directory(nri: Setup) -> None:
    """Runtimes before NRI v0.12 report the stop through StateChange: the same cleanup."""
    directory = await create(nri, "c1")
    await nri.peer.call(
        "StateChange",
        api.StateChangeEvent(event=api.STOP_CONTAINER, container=api.Container(id="c1")),
        api.Empty,
    )
    assert not directory.exists() and nri.service.allocation("c1") is None


async def test_the_sweep_keeps_a_running_containers_directory_whose_allocation_was_released(
    nri: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """`hcsctl release` (the API's Release) frees a running container's memory; its libhcs
    still reads quota.conf at each new process and fails closed without it, so the directory
    stays until the runtime says the container ended. Logged once, not at every sweep."""
    running = await create(nri, "c-running")
    nri.service.release("c-running")
    injector = nri.plugin.injector
    with caplog.at_level("INFO"):
        assert injector.sweep() == []
        assert injector.sweep() == []
    assert (running / "quota.conf").is_file()
    assert caplog.text.count("c-running: keeping its quota directory") == 1
    await nri.peer.call(
        "StopContainer",
        api.ContainerRequest(container=api.Container(id="c-running")),
        api.StopContainerResponse,
    )
    assert not running.exists()


async def test_the_sweep_removes_what_a_failed_removal_left(
    nri: Setup, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop whose directory removal failed (a file still busy): the sweep tries again; a
    running container's directory and names that are no container id stay."""
    running = await create(nri, "c-running")
    leftover = await create(nri, "c-left")
    (leftover / "core").write_bytes(b"x")
    (nri.run_dir / "containers" / "not-ours!").mkdir()  # no container id: never touched
    with monkeypatch.context() as failing:
        failing.setattr(container_files, "remove_tree", lambda fd, name: [f"{name}: busy"])
        await nri.peer.call(
            "StopContainer",
            api.ContainerRequest(container=api.Container(id="c-left")),
            api.StopContainerResponse,
        )
    assert leftover.is_dir() and nri.service.allocation("c-left") is None
    injector = nri.plugin.injector
    with caplog.at_level("INFO"):
        assert injector.sweep() == ["c-left"]
    assert not leftover.exists() and running.is_dir()
    assert (nri.run_dir / "containers" / "not-ours!").is_dir()
    assert "swept 1 quota directory of containers that have ended: c-left" in caplog.text
    assert injector.sweep() == []


async def test_a_reconcile_removes_the_directories_of_containers_the_runtime_no_longer_lists(
    nri: Setup,
) -> None:
    """The case the sweep cannot judge (a stop missed while hcsd was down) is the runtime's
    list's to settle: a released container it does not list loses its directory, one it lists
    keeps it."""
    gone = await create(nri, "c-gone")
    alive = await create(nri, "c-alive")
    nri.service.release("c-gone")
    nri.service.release("c-alive")
    assert nri.plugin.injector.sweep() == []
    await nri.peer.call(
        "Synchronize",
        api.SynchronizeRequest(
            pods=[api.PodSandbox(id="p1", name="pod", namespace="ns", uid="u1")],
            containers=[
                api.Container(
                    id="c-alive", pod_sandbox_id="p1", name="c", state=api.CONTAINER_RUNNING
                )
            ],
        ),
        api.SynchronizeResponse,
    )
    assert not gone.exists() and alive.is_dir()


async def test_the_sweep_runs_every_interval(nri: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    leftover = await create(nri, "c-left")
    with monkeypatch.context() as failing:
        failing.setattr(container_files, "remove_tree", lambda fd, name: [f"{name}: busy"])
        nri.plugin.injector.stopped("c-left")
    task = asyncio.create_task(nri.plugin.injector.sweep_every(0.01))
    try:
        await eventually(lambda: not leftover.exists(), "the sweep removed c-left's directory")
    finally:
        task.cancel()
