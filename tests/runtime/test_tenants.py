"""What a tenant's container gets and what it cannot do, against a real containerd 2.3 with runc
and hcsd running with its unit's capabilities (tests/capabilities.py: no CAP_DAC_OVERRIDE).

- A non-root container (uid 1000, and an OpenShift-style uid with gid 0) loads libhcs through
  /etc/ld.so.preload and shares its quota across processes through the region hcsd made for
  it (glibc skips an unreadable preload file silently; a non-root process cannot create the
  region in a root-owned directory).
- A root container cannot make its host files unremovable (`chmod 0555 /run/hcs` once broke
  every later NRI Synchronize) nor rewrite its quota.
- On a node in cluster mode, a pod without an assignment gets nothing from local annotations.

The GPU is the fake CUDA driver (tests/fakes): `gpu_app` allocates through it, libhcs in front.
The busybox image has no libc, so the host's is mounted read-only, as a pod's hostPath volume.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.contract import region
from hcsd.contract.assignment import sign
from hcsd.model import Allocation, Grant
from hcsd.watchdog.accounted import AccountedUsage
from tests.capabilities import setpriv_prefix
from tests.fakes import build_fakes
from tests.harness.daemon import ROOT, Daemon, Settings
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd, CrictlError
from tests.runtime.node import GPU0, KEY, allocations, runtime_hcsd, start_registered

pytestmark = pytest.mark.slow

GiB = 2**30
LIBC_DIR = Path("/lib/x86_64-linux-gnu").resolve()
LOADER_DIR = Path("/lib64").resolve()


def unit_hcsd(directory: Path, containerd: Containerd, settings: Settings | None = None) -> Daemon:
    """hcsd on the runtime test node with only its unit's capabilities, on containerd's NRI."""
    daemon = runtime_hcsd(directory, containerd.nri_socket, settings=settings)
    daemon.prefix = setpriv_prefix()
    start_registered(daemon)
    return daemon


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = unit_hcsd(tmp_path / "hcsd", containerd)
    yield daemon
    daemon.close()


@pytest.fixture(scope="module")
def fakes() -> Path:
    built = build_fakes()
    if built is None:
        pytest.skip("NO C COMPILER: the fake CUDA driver cannot be built")
    if not (LIBC_DIR / "libc.so.6").exists() or not (LOADER_DIR / "ld-linux-x86-64.so.2").exists():
        pytest.skip(f"no glibc at {LIBC_DIR} and {LOADER_DIR} to mount into the container")
    return built


# Two processes of one container: the first holds 6Gi of its 8Gi, the second then asks for
# 4 x 1Gi and must get 2. Each prints how many blocks it got; the first also whether libhcs is
# mapped in it.
TWO_PROCESSES = """
echo "uid=$(id -u) gid=$(id -g)"
gpu() { env LD_LIBRARY_PATH=/opt/fakes /opt/fakes/gpu_app 1024 "$1" > "/tmp/$2" 2>&1 & }
wait_for() { while ! grep -q allocated "/tmp/$1"; do sleep 0.1; done; }
gpu 6 first; first=$!
wait_for first
echo "first: $(cat /tmp/first); libhcs mapped: $(grep -c /usr/lib/hcs/libhcs.so /proc/$first/maps)"
gpu 4 second; wait_for second
echo "second: $(cat /tmp/second)"
echo finished
sleep 3600
"""


@pytest.mark.parametrize(
    "user",
    [pytest.param((1000, 1000), id="uid-1000"), pytest.param((1000680000, 0), id="openshift")],
)
def test_a_non_root_container_gets_its_quota_across_processes(
    containerd: Containerd, hcsd: Daemon, fakes: Path, user: tuple[int, int]
) -> None:
    pod = containerd.run_pod("notebook", "team-a", f"uid-{user[0]}")
    ctr = containerd.create_container(
        pod,
        "main",
        command=["sh", "-c", TWO_PROCESSES],
        annotations={"hcs.io/vram": "8Gi"},
        mounts=[(LIBC_DIR, "/lib/x86_64-linux-gnu"), (LOADER_DIR, "/lib64"), (fakes, "/opt/fakes")],
        user=user,
    )
    shm = hcsd.dir / "containers" / ctr / "usage.shm"
    made = shm.read_bytes() if shm.exists() else b""  # before any process of the container
    containerd.start(ctr)
    try:
        wait_for(lambda: "finished" in containerd.logs(ctr), "both processes allocated", timeout=30)
    finally:
        out = containerd.logs(ctr)
        print(out)
    assert f"uid={user[0]} gid={user[1]}" in out
    assert "first: allocated 6 of 6; libhcs mapped: " in out and "libhcs mapped: 0" not in out, out
    assert "second: allocated 2 of 4" in out, out  # the quota is the container's, not each one's
    assert made == region.empty_region()  # hcsd made it; no process of the container had to
    assert (shm.stat().st_uid, shm.stat().st_gid) == user
    held = Allocation(ctr, (Grant(GPU0, 8 * GiB),))
    assert AccountedUsage(hcsd.dir)(held) == {GPU0: 8 * GiB}  # hcsd reads what libhcs counted
    check = subprocess.run(
        [str(ROOT / "libhcs/build/hcs-region"), "check", str(shm)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


# What a root tenant tries with the files hcsd mounted: make the directory read-only, plant a
# file, rewrite its quota, grow its region.
MEDDLE = """
chmod 0555 /run/hcs; echo "chmod dir=$?"
touch /run/hcs/planted; echo "plant=$?"
echo 'device.0.vram_limit=999999999999' > /run/hcs/quota.conf; echo "rewrite quota=$?"
chmod 0777 /run/hcs/quota.conf; echo "chmod quota=$?"
echo done
exec sleep 300
"""


def test_a_root_container_cannot_break_removal_nor_rewrite_its_quota(
    containerd: Containerd, hcsd: Daemon
) -> None:
    pod = containerd.run_pod("tenant", "team-b", "uid-b")
    ctr = containerd.create_container(
        pod, "main", command=["sh", "-c", MEDDLE], annotations={"hcs.io/vram": "2Gi"}
    )
    directory = hcsd.dir / "containers" / ctr
    quota = (directory / "quota.conf").read_text()
    containerd.start(ctr)
    wait_for(lambda: "done" in containerd.logs(ctr), "the container ran")
    out = containerd.logs(ctr)
    left = sorted(p.name for p in directory.iterdir())
    host_quota = (directory / "quota.conf").read_text()
    containerd.stop_container(ctr, timeout=1)
    # What used to fail from here on: the removal (now at the stop), then every Synchronize,
    # so that the next containerd (or hcsd) restart left hcsd unregistered and every GPU pod
    # without devices.
    wait_for(lambda: not directory.exists(), "the stop took its directory")
    containerd.remove_container(ctr)
    containerd.restart()
    wait_for(lambda: hcsd.logs().count("nri: synchronized") >= 2, "Synchronize after a restart")
    later = containerd.create_container(pod, "later", annotations={"hcs.io/vram": "2Gi"})
    env = dict(e.split("=", 1) for e in containerd.runtime_spec(later)["process"]["env"])
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf" and later in allocations(hcsd)
    assert "Traceback" not in hcsd.logs()
    # Inside, /run/hcs is the container's own directory; its quota is read-only.
    assert "chmod dir=0" in out
    assert "rewrite quota=1" in out and "chmod quota=1" in out, out
    assert host_quota == quota and left == ["quota.conf", "usage.shm"]


def test_on_a_cluster_node_a_pod_gets_devices_only_from_its_assignment(
    containerd: Containerd, tmp_path: Path
) -> None:
    hcsd = unit_hcsd(tmp_path / "hcsd", containerd, {"node": {"mode": "cluster"}})
    try:
        pod = containerd.run_pod("greedy", "team-c", "uid-c")
        with pytest.raises(CrictlError) as refused:
            containerd.create_container(pod, "main", annotations={"hcs.io/devices": "1"})
        assert "team-c/greedy/main: asks for devices with hcs.io/devices" in str(refused.value)
        assert 'node.mode = "cluster"' in str(refused.value)
        assert "(refused: no_assignment)" in str(refused.value)
        assert allocations(hcsd) == {}
        body = {
            "v": 1,
            "node": "rt-node",
            "pod_uid": "uid-d",
            "issued": time.time(),
            "containers": {"main": [{"uuid": GPU0, "vram": 2 * GiB, "compute": 0}]},
        }
        placed = containerd.run_pod(
            "placed", "team-d", "uid-d", annotations={"hcs.io/assignment": sign(body, KEY)}
        )
        ctr = containerd.create_container(placed, "main")
        assert allocations(hcsd)[ctr]["source"] == "assignment"
        hcsd.configure({"node": {"mode": "standalone"}})
        assert hcsd.process is not None
        os.kill(hcsd.process.pid, 1)  # SIGHUP: back to standalone without a restart
        wait_for(lambda: "node mode standalone" in hcsd.logs(), "the reload")
        local = containerd.create_container(pod, "again", annotations={"hcs.io/vram": "1Gi"})
        assert allocations(hcsd)[local]["source"] == "local"
    finally:
        hcsd.close()


# Overmount the preload file from a new user and mount namespace: the children of `sh` there
# would start without libhcs (a static binary needs no such trick; the watchdog sees both).
ESCAPE = """
echo > /tmp/none
busybox unshare -Urm sh -c 'busybox mount -o bind /tmp/none /etc/ld.so.preload &&
  echo "preload now: [$(cat /etc/ld.so.preload)]"'
echo "rc=$?"
"""


@pytest.mark.parametrize(
    ("seccomp", "escaped"),
    [
        pytest.param(None, True, id="unconfined"),
        pytest.param("runtime/default", False, id="runtime-default"),
    ],
)
def test_seccomp_runtime_default_keeps_a_tenant_from_dropping_the_preload(
    containerd: Containerd, hcsd: Daemon, seccomp: str | None, escaped: bool
) -> None:
    """docs/security.md: the preload is a bind mount a tenant cannot remove, but one that may
    create a user namespace can cover it in a mount namespace of its own. The runtime's
    default seccomp profile refuses unshare (and namespace flags to clone) to a container
    without CAP_SYS_ADMIN."""
    pod = containerd.run_pod("escape", "team-e", f"uid-e-{escaped}")
    ctr = containerd.create_container(
        pod,
        "main",
        command=["sh", "-c", ESCAPE],
        annotations={"hcs.io/vram": "1Gi"},
        seccomp=seccomp,
    )
    containerd.start(ctr)
    wait_for(lambda: "rc=" in containerd.logs(ctr), "the container ran")
    out = containerd.logs(ctr)
    assert ("preload now: []" in out and "rc=0" in out) is escaped, out
    if not escaped:
        assert "Operation not permitted" in out and "rc=1" in out, out
