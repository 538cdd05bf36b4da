"""What a container leaves when it ends, against a real containerd 2.3 with NRI: hcsd removes
its quota directory at the stop (NRI StopContainer, which containerd also sends for a container
that exits on its own), not at kubelet's later RemoveContainer; and after containers of two
vendors end, nothing of theirs is left: processes, mounts, cgroups, directories, allocations.

The figures (container end → directory gone) are printed; run with `-s` to see them.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import cgroups as cgroup_tree
from tests.harness.daemon import Daemon
from tests.harness.leftovers import command, mounts_naming, processes_in, running
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd
from tests.runtime.node import allocations, runtime_hcsd, start_registered

pytestmark = pytest.mark.slow

# One GPU and one NPU, their device nodes borrowing /dev/null's numbers (1:3), so runc makes
# real nodes in each container.
TWO_VENDORS = """
[shared_nodes]
nvidia = ["/dev/nvidiactl:1:3"]
ascend = ["/dev/davinci_manager:1:3", "/dev/devmm_svm:1:3", "/dev/hisi_hdc:1:3"]

[[device]]
uuid = "GPU-cleanup-0"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 0
pci_bus_id = "0000:17:00.0"
vram = "80Gi"
tflops_fp16 = 312
nodes = ["/dev/nvidia0:1:3"]

[[device]]
uuid = "NPU-cleanup-0"
vendor = "ascend"
model = "Ascend910B3"
index = 0
pci_bus_id = "0000:c1:00.0"
vram = "64Gi"
tflops_fp16 = 313
nodes = ["/dev/davinci0:1:3"]
"""
POLL = 0.002  # seconds between looks at the directory: the figures' resolution


def two_vendor_hcsd(runtime: Containerd, directory: Path) -> Daemon:
    """hcsd on the two-vendor node, registered with `runtime`'s NRI, with no sweep during
    the test: only the stop may remove the directories."""
    daemon = runtime_hcsd(directory, runtime.nri_socket)
    node = directory / "two-vendors.toml"
    node.write_text(TWO_VENDORS)
    daemon.configure({"discovery": {"simulated_node": node}, "runtime": {"sweep_interval": 3600}})
    start_registered(daemon)
    return daemon


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = two_vendor_hcsd(containerd, tmp_path / "hcsd")
    yield daemon
    daemon.close()


def quota_dir(hcsd: Daemon, container_id: str) -> Path:
    return hcsd.dir / "containers" / container_id


def gone_at(path: Path, timeout: float = 10.0) -> float:
    """The wall-clock time at which `path` was first seen gone (polled every POLL s)."""
    deadline = time.monotonic() + timeout
    while path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} still there after {timeout} s")
        time.sleep(POLL)
    return time.time()


def finished_at(containerd: Containerd, container_id: str) -> float:
    """When the container's process exited, as containerd recorded it (wall clock)."""
    stamp = containerd.inspect(container_id)["status"]["finishedAt"]
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return moment.timestamp() + float(f"0.{fraction or 0}")


def start_vendor(containerd: Containerd, pod: str, vendor: str, command: list[str]) -> str:
    annotations = {"hcs.io/vram": "1Gi", "hcs.io/vendors": vendor}
    ctr = containerd.create_container(pod, vendor, command=command, annotations=annotations)
    containerd.start(ctr)
    return ctr


def test_the_quota_directory_goes_when_the_container_stops(
    containerd: Containerd, hcsd: Daemon
) -> None:
    """Both ends a container has: it exits on its own (containerd sends StopContainer from its
    exit event) or kubelet stops it (CRI StopContainer). Neither waits for RemoveContainer."""
    pod = containerd.run_pod("cleanup", "team-c", "uid-c1")
    # One container at a time: checked while it surely runs (starting a second one can take
    # longer than the first one's life on a loaded machine).
    exits = start_vendor(containerd, pod, "nvidia", ["sh", "-c", "sleep 2"])
    assert quota_dir(hcsd, exits).is_dir()
    assert exits in allocations(hcsd)

    removed = gone_at(quota_dir(hcsd, exits))
    # containerd tells NRI plugins while it deletes the task, before CRI shows the exit
    containerd.wait_exited(exits)  # exited, not removed: kubelet's GC does that much later
    exited = finished_at(containerd, exits)
    print(f"\nexit on its own -> quota directory gone: {(removed - exited) * 1000:.1f} ms")
    assert exits not in allocations(hcsd), "released when it exited"

    stopped = start_vendor(containerd, pod, "ascend", ["sleep", "300"])
    assert quota_dir(hcsd, stopped).is_dir()
    assert stopped in allocations(hcsd)
    asked = time.time()
    containerd.stop_container(stopped, timeout=1)
    removed = gone_at(quota_dir(hcsd, stopped))
    print(
        f"crictl stop -> quota directory gone: {(removed - asked) * 1000:.1f} ms "
        f"(container's exit -> gone: {(removed - finished_at(containerd, stopped)) * 1000:.1f} ms)"
    )
    containerd.wait_exited(stopped)
    assert stopped not in allocations(hcsd), "released when it stopped"
    # kubelet's removal comes later and finds nothing to do
    for ctr in (exits, stopped):
        containerd.remove_container(ctr)
    assert "cannot remove" not in hcsd.logs() and "Traceback" not in hcsd.logs()


def test_containerd_17_stops_a_container_that_exits_on_its_own_too(
    containerd_17: Containerd, tmp_path: Path
) -> None:
    """containerd 1.7 (NRI v0.8, the stop arrives through StateChange) removes it the same."""
    hcsd = two_vendor_hcsd(containerd_17, tmp_path / "hcsd")
    try:
        pod = containerd_17.run_pod("cleanup-17", "team-c", "uid-c3")
        exits = start_vendor(containerd_17, pod, "ascend", ["sh", "-c", "sleep 1"])
        assert quota_dir(hcsd, exits).is_dir()
        removed = gone_at(quota_dir(hcsd, exits))
        containerd_17.wait_exited(exits)
        gone_ms = (removed - finished_at(containerd_17, exits)) * 1000
        print(f"\ncontainerd 1.7: exit on its own -> quota directory gone: {gone_ms:.1f} ms")
        assert exits not in allocations(hcsd)
    finally:
        hcsd.close()


def test_nothing_is_left_after_containers_of_two_vendors_end(
    containerd: Containerd, hcsd: Daemon
) -> None:
    pod = containerd.run_pod("leftovers", "team-c", "uid-c2")
    ended = {
        vendor: start_vendor(containerd, pod, vendor, ["sleep", "300"])
        for vendor in ("nvidia", "ascend")
    }
    pids = {ctr: int(containerd.inspect(ctr)["info"]["pid"]) for ctr in ended.values()}
    cgroups = [path for pid in pids.values() for path in cgroup_tree.of_process(pid)]
    assert cgroups and all(path.is_dir() for path in cgroups)
    held = allocations(hcsd)
    granted = {held[ctr]["grants"][0]["device_uuid"] for ctr in ended.values()}  # type: ignore[index]
    assert granted == {"GPU-cleanup-0", "NPU-cleanup-0"}
    for ctr in ended.values():
        containerd.stop_container(ctr, timeout=1)
    # At the stop: directories and allocations go (the containers still exist in containerd).
    wait_for(lambda: not allocations(hcsd), "both allocations released")
    assert sorted(os.listdir(hcsd.dir / "containers")) == []
    containerd.stop_pod(pod)
    containerd.remove_pod(pod)
    left = leftovers(set(ended.values()), pids, cgroups, hcsd)
    assert left == [], left
    snapshot = hcsd.hcsctl("--json", "allocations")
    assert snapshot.returncode == 0 and snapshot.stdout.strip() == "[]"


def leftovers(ids: set[str], pids: dict[str, int], cgroups: list[Path], hcsd: Daemon) -> list[str]:
    """Everything of these containers that is still on the host, each named."""
    found = [f"process {pid} of {ctr[:12]}" for ctr, pid in pids.items() if running(pid)]
    found += [f"process {command(pid)} in their cgroups" for pid in processes_in(cgroups)]
    found += [f"mount {path} naming one of them" for path in mounts_naming(ids)]
    found += [f"a mount from {path}" for path in mounts_naming([f"{hcsd.dir}/containers/"])]
    found += [f"cgroup {path}" for path in cgroups if path.exists()]
    found += [f"directory {path}" for path in (hcsd.dir / "containers").iterdir()]
    return found
