"""The VRAM watchdog against containers that a real containerd and runc started: the cgroup
paths are theirs, the container ids and pod names come through hcsd's NRI plugin, and the
kill goes through the cgroup runc made.

The GPU side is the fake NVML: once a container runs, the test makes it report that the
container's process holds 9Gi on a 4Gi grant, as the driver would for a process that reached
the device without libhcs (direct ioctls, a static binary).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.watchdog.cgroups import CgroupMapper
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd
from tests.runtime.node import runtime_hcsd, start_registered
from tests.watchdog.conftest import UUIDS, GiB, GpuNode, make_gpu_node

pytestmark = pytest.mark.slow


@pytest.fixture
def gpu(tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch) -> GpuNode:
    (tmp_path / "gpu").mkdir()
    return make_gpu_node(tmp_path / "gpu", fake_libs, monkeypatch)


@pytest.fixture
def hcsd(containerd: Containerd, gpu: GpuNode, tmp_path: Path) -> Iterator[Daemon]:
    daemon = runtime_hcsd(
        tmp_path / "hcsd",
        containerd.nri_socket,
        uuid=UUIDS[0],
        key=None,
        settings={
            "watchdog": {"interval": 0.5, "policy": "kill"},
            "discovery": {"nvml_library": gpu.library},
        },
    )
    start_registered(daemon)
    yield daemon
    daemon.close()


def test_a_real_container_over_its_grant_is_killed_through_its_cgroup(
    containerd: Containerd, hcsd: Daemon, gpu: GpuNode
) -> None:
    pod = containerd.run_pod("trainer", "team-a", "uid-1")
    ctr = containerd.create_container(
        pod,
        "main",
        command=["sh", "-c", "sleep 3600 & sleep 3600"],  # two processes in the container
        annotations={"hcs.io/vram": "4Gi"},
    )
    other_pod = containerd.run_pod("neighbour", "team-b", "uid-2")
    neighbour = containerd.create_container(other_pod, "main", annotations={"hcs.io/vram": "4Gi"})
    containerd.start(ctr)
    containerd.start(neighbour)
    pid = int(containerd.inspect(ctr)["info"]["pid"])
    neighbour_pid = int(containerd.inspect(neighbour)["info"]["pid"])
    # The path containerd and runc gave it names the container: the watchdog's mapping.
    ids = CgroupMapper().ids(pid)
    assert ids is not None and ids[-1] == ctr, Path(f"/proc/{pid}/cgroup").read_text()
    gpu.add_process(0, neighbour_pid, 3 * GiB)  # within its grant
    gpu.add_process(0, pid, 9 * GiB)  # the driver sees 9Gi that libhcs never saw
    assert containerd.wait_exited(ctr, timeout=30) == 137  # SIGKILL; 30 s: slack under load
    killed = (
        r"team-a/trainer/main: holds 9Gi of device memory on GPU-\S+, granted 4Gi .*"
        r"policy kill: SIGKILL sent to 2 process\(es\) \(.*, found through cgroup\)"
    )
    # hcsd logs the kill once it is done: the container may be seen gone before that.
    wait_for(lambda: re.search(killed, hcsd.logs()), "hcsd logged the kill", timeout=30)
    logs = hcsd.logs()
    assert containerd.state(neighbour) == "CONTAINER_RUNNING"
    assert "team-b/neighbour/main: holds" not in logs
