"""hcsd's NRI plugin against a real containerd 2.x with runc: devices, env, mounts and the
libhcs preload in the OCI spec and inside the running container; refusals failing creation;
runtime and hcsd restarts losing nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.contract.assignment import sign
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd, CrictlError
from tests.runtime.node import GPU0, KEY, allocations, runtime_hcsd, start_registered

pytestmark = pytest.mark.slow


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = runtime_hcsd(tmp_path / "hcsd", containerd.nri_socket)
    start_registered(daemon)
    yield daemon
    daemon.close()


INSPECT = (
    "stat -c 'node %F %t %T' /dev/nvidia0; echo cuda=$CUDA_VISIBLE_DEVICES; "
    "echo cfg=$HCS_CONFIG; cat /run/hcs/quota.conf; cat /etc/ld.so.preload; "
    "ls /usr/lib/hcs"
)


def test_container_gets_devices_env_mounts_and_quota(containerd: Containerd, hcsd: Daemon) -> None:
    pod = containerd.run_pod("trainer", "team-a", "uid-1")
    ctr = containerd.create_container(
        pod, "main", command=["sh", "-c", INSPECT], annotations={"hcs.io/vram": "8Gi"}
    )
    held = allocations(hcsd)[ctr]
    assert held["pod"] == {"namespace": "team-a", "name": "trainer", "uid": "uid-1"}
    spec = containerd.inspect(ctr)["info"]["runtimeSpec"]  # type: ignore[index]
    devices = {d["path"]: d for d in spec["linux"]["devices"]}
    assert devices["/dev/nvidia0"]["type"] == "c" and devices["/dev/nvidia0"]["major"] == 1
    assert "/dev/nvidiactl" in devices
    env = dict(e.split("=", 1) for e in spec["process"]["env"])
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf" and env["CUDA_VISIBLE_DEVICES"] == GPU0
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert "ro" in mounts["/usr/lib/hcs/libhcs.so"]["options"]
    containerd.start(ctr)
    wait_for(lambda: "libhcs.so" in containerd.logs(ctr), "the container ran")
    out = containerd.logs(ctr)
    assert "node character special file 1 3" in out
    assert f"cuda={GPU0}" in out and "cfg=/run/hcs/quota.conf" in out
    assert "device.0.vram_limit=8589934592" in out and f"device.0.uuid={GPU0}" in out
    assert "/usr/lib/hcs/libhcs.so" in out
    containerd.stop_container(ctr)
    wait_for(lambda: ctr not in allocations(hcsd), "stop released the allocation")
    containerd.remove_container(ctr)


def test_forged_assignment_fails_creation_with_the_reason(
    containerd: Containerd, hcsd: Daemon
) -> None:
    body = {
        "v": 1,
        "node": "rt-node",
        "pod_uid": "uid-2",
        "issued": time.time(),
        "containers": {"main": [{"uuid": GPU0, "vram": 2**30, "compute": 0}]},
    }
    forged = json.loads(sign(body, b"not-the-cluster-key"))
    pod = containerd.run_pod(
        "forged", "team-b", "uid-2", annotations={"hcs.io/assignment": json.dumps(forged)}
    )
    with pytest.raises(CrictlError, match="signature does not verify"):
        containerd.create_container(pod, "main", command=["true"])
    assert allocations(hcsd) == {}
    genuine = sign(body, KEY)
    pod = containerd.run_pod(
        "signed", "team-b", "uid-2", annotations={"hcs.io/assignment": genuine}
    )
    ctr = containerd.create_container(pod, "main", command=["true"])
    assert allocations(hcsd)[ctr]["source"] == "assignment"


def test_over_capacity_fails_creation(containerd: Containerd, hcsd: Daemon) -> None:
    pod = containerd.run_pod("greedy", "team-c", "uid-3")
    with pytest.raises(CrictlError, match=r"hcsd: team-c/greedy/main: .*1Ti wanted"):
        containerd.create_container(
            pod, "main", command=["true"], annotations={"hcs.io/vram": "1Ti"}
        )


def test_restarts_lose_nothing(containerd: Containerd, hcsd: Daemon) -> None:
    pod = containerd.run_pod("long", "team-d", "uid-4")
    ctr = containerd.create_container(
        pod, "main", command=["sleep", "300"], annotations={"hcs.io/vram": "4Gi"}
    )
    containerd.start(ctr)
    containerd.restart()
    wait_for(lambda: hcsd.logs().count("nri: registered") >= 2, "hcsd re-registered")
    wait_for(lambda: "nri: synchronized" in hcsd.logs(), "Synchronize after the restart")
    assert ctr in allocations(hcsd), "a running container kept its allocation"
    assert hcsd.stop() == 0
    hcsd.start()
    wait_for(lambda: hcsd.logs().count("nri: registered") >= 3, "hcsd registered again")
    assert ctr in allocations(hcsd), "the ledger kept it across an hcsd restart"
    containerd.stop_container(ctr)
    wait_for(lambda: ctr not in allocations(hcsd), "stop released it")
