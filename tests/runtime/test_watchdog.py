"""The VRAM watchdog against containers that a real containerd and runc started: the cgroup
paths are theirs, the container ids and pod names come through hcsd's NRI plugin, and the
kill goes through the cgroup runc made.

The GPU side is the fake NVML: once a container runs, the test makes it report that the
container's process holds 9Gi on a 4Gi grant, as the driver would for a process that reached
the device without libhcs (direct ioctls, a static binary).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.watchdog.cgroups import CgroupMapper
from tests.fakes import build_fakes
from tests.integration.test_daemon import Daemon
from tests.runtime.containerd import Containerd
from tests.runtime.test_containerd import wait_for
from tests.watchdog.conftest import UUIDS, GiB, GpuNode, make_gpu_node

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Device nodes borrow /dev/null's numbers (1:3): runc creates a real node in the container.
NODE = f"""
[shared_nodes]
nvidia = ["/dev/nvidiactl:1:3"]

[[device]]
uuid = "{UUIDS[0]}"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 0
pci_bus_id = "0000:17:00.0"
vram = "80Gi"
tflops_fp16 = 312
nodes = ["/dev/nvidia0:1:3"]
"""


@pytest.fixture
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GpuNode:
    libs = build_fakes()
    if libs is None:
        pytest.skip("NO C COMPILER: the fake vendor libraries cannot be built")
    (tmp_path / "gpu").mkdir()
    return make_gpu_node(tmp_path / "gpu", libs, monkeypatch)


@pytest.fixture
def hcsd(containerd: Containerd, gpu: GpuNode, tmp_path: Path) -> Iterator[Daemon]:
    subprocess.run(["make", "-s", "-C", str(ROOT / "libhcs")], check=True)
    (tmp_path / "hcsd").mkdir()
    node = tmp_path / "node.toml"
    node.write_text(NODE)
    daemon = Daemon(tmp_path / "hcsd", node_file=node)
    daemon.write_config(
        "binpack", '[health]\nsource = "off"\n[watchdog]\ninterval = 0.5\npolicy = "kill"\n'
    )
    text = daemon.config.read_text()
    text = text.replace(
        f'nri_socket = "{daemon.dir}/nri.sock"', f'nri_socket = "{containerd.nri_socket}"'
    )
    text = text.replace(
        "[runtime]\n", f'[runtime]\nlibhcs_path = "{ROOT / "libhcs/build/libhcs.so"}"\n'
    )
    text = text.replace("[discovery]\n", f'[discovery]\nnvml_library = "{gpu.library}"\n')
    daemon.config.write_text(text)
    daemon.start()
    wait_for(lambda: "nri: registered" in daemon.logs(), "hcsd registered with NRI")
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
    assert containerd.wait_exited(ctr, timeout=10) == 137  # SIGKILL
    logs = hcsd.logs()
    assert re.search(
        r"team-a/trainer/main: holds 9Gi of device memory on GPU-\S+, granted 4Gi .*"
        r"policy kill: SIGKILL sent to 2 process\(es\) \(.*, found through cgroup\)",
        logs,
    ), logs
    assert containerd.state(neighbour) == "CONTAINER_RUNNING"
    assert "team-b/neighbour/main: holds" not in logs
