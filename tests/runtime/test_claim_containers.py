"""A DRA claim's containers on a real containerd 2.3 with CDI and hcsd's NRI plugin: the
containers get the claim's devices through the CDI ids kubelet passes (CRI's `CDI_devices`),
and hcsd links them to the claim by the quota file their CDI edits mount.

- The VRAM watchdog charges every container of the claim to the claim's grant: two containers
  each under it but together over it are killed, through their cgroups; a container of the
  claim that holds no device memory, and another pod's container, keep running.
- The claim's usage region becomes its container's user's when the container is created:
  another non-root uid in the container can neither write it nor rewrite the quota file.

hcsd runs with its unit's capabilities (tests/capabilities.py). The GPU is the fake NVML,
told which pids hold how much device memory, as in tests/runtime/test_watchdog.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract import dra
from tests.capabilities import setpriv_prefix
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Binaries, Containerd
from tests.runtime.node import runtime_hcsd, start_registered
from tests.watchdog.conftest import UUIDS, GiB, GpuNode, make_gpu_node

pytestmark = pytest.mark.slow

UID = "4d1e0c9a-7b2f-4e51-8a3c-1f6b9d2e7c05"
CDI_ID = f"{dra.CDI_CLAIM_KIND}={UID}-nvidia-0"


@pytest.fixture
def gpu(tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch) -> GpuNode:
    (tmp_path / "gpu").mkdir()
    return make_gpu_node(tmp_path / "gpu", fake_libs, monkeypatch)


@pytest.fixture
def cdi_containerd(runtime_binaries: Binaries, tmp_path: Path) -> Iterator[Containerd]:
    """containerd reading CDI specs from the directory hcsd writes them to."""
    config = tmp_path / "cdi.toml"
    config.write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n"
        f'  enable_cdi = true\n  cdi_spec_dirs = ["{tmp_path / "hcsd" / "cdi"}"]\n'
    )
    runtime = Containerd(
        runtime_binaries,
        tmp_path / "containerd",
        nri_socket=tmp_path / "nri" / "nri.sock",
        imports=[config],
    )
    try:
        runtime.launch()
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def hcsd(cdi_containerd: Containerd, gpu: GpuNode, tmp_path: Path) -> Iterator[Daemon]:
    daemon = runtime_hcsd(
        tmp_path / "hcsd",
        cdi_containerd.nri_socket,
        uuid=UUIDS[0],
        key=None,
        settings={
            "watchdog": {
                "interval": 0.5,
                "policy": "kill",
                "tolerance_percent": 0,
                "process_overhead": 256 * 2**20,
            },
            "discovery": {"nvml_library": gpu.library},
        },
    )
    daemon.prefix = setpriv_prefix()
    start_registered(daemon)
    assert Path(daemon.settings["runtime"]["cdi_dir"]) == tmp_path / "hcsd" / "cdi"  # type: ignore[arg-type]
    yield daemon
    daemon.close()


def prepare_claim(daemon: Daemon, memory: str) -> None:
    """What the kubelet plugin asks of hcsd for a claim allocated 4Gi of nvidia-0."""
    with Client(daemon.socket) as client:
        answer = client.prepare_claim(
            pb.PrepareClaimRequest(
                claim=pb.PodRef(namespace="team-a", name="train-gpu", uid=UID),
                devices=[
                    pb.ClaimDevice(request="gpu", device="nvidia-0", memory=memory, compute="0")
                ],
            )
        )
    assert [list(d.cdi_device_ids) for d in answer.devices] == [[CDI_ID]]


def pid_of(containerd: Containerd, container_id: str) -> int:
    return int(containerd.inspect(container_id)["info"]["pid"])


def test_the_containers_of_a_claim_are_watched_against_the_claims_grant(
    cdi_containerd: Containerd, hcsd: Daemon, gpu: GpuNode
) -> None:
    containerd = cdi_containerd
    prepare_claim(hcsd, "4Gi")
    pod = containerd.run_pod("trainer", "team-a", "uid-1")
    main = containerd.create_container(
        pod, "main", command=["sh", "-c", "sleep 3600 & sleep 3600"], cdi_devices=[CDI_ID]
    )
    helper = containerd.create_container(pod, "helper", cdi_devices=[CDI_ID])
    idle = containerd.create_container(pod, "idle", cdi_devices=[CDI_ID])
    other_pod = containerd.run_pod("neighbour", "team-b", "uid-2")
    neighbour = containerd.create_container(other_pod, "main", annotations={"hcs.io/vram": "4Gi"})
    for ctr in (main, helper, idle, neighbour):
        containerd.start(ctr)
    # The claim's CDI spec gave them the device and the claim's quota file.
    mounts = {m["destination"]: m["source"] for m in containerd.runtime_spec(main)["mounts"]}
    assert mounts["/run/hcs/quota.conf"] == str(hcsd.dir / "claims" / f"claim-{UID}" / "quota.conf")
    wait_for(lambda: hcsd.logs().count(f"uses claim-{UID}") == 3, "the three containers linked")
    # Each container is under the claim's 4Gi; together (3Gi + 2Gi) they are over it.
    gpu.add_process(0, pid_of(containerd, neighbour), 3 * GiB)
    gpu.add_process(0, pid_of(containerd, main), 3 * GiB)
    gpu.add_process(0, pid_of(containerd, helper), 2 * GiB)
    assert containerd.wait_exited(main, timeout=10) == 137  # SIGKILL
    assert containerd.wait_exited(helper, timeout=10) == 137
    killed = (
        rf"claim team-a/train-gpu \(claim-{UID}\): holds 5Gi of device memory on "
        r"GPU-\S+, granted 4Gi .*policy kill: SIGKILL sent to 3 process\(es\) "
        r"\(.*, found through cgroup\)"
    )
    wait_for(lambda: re.search(killed, hcsd.logs()), "hcsd logged the kill", timeout=10)
    assert containerd.state(idle) == "CONTAINER_RUNNING"  # held no device memory
    assert containerd.state(neighbour) == "CONTAINER_RUNNING"  # within its own grant
    assert "Traceback" not in hcsd.logs()


def test_the_links_come_back_from_synchronize_after_a_kill_9_of_hcsd(
    cdi_containerd: Containerd, hcsd: Daemon, gpu: GpuNode
) -> None:
    """The links are hcsd's memory only: a restarted hcsd learns them again from the
    containers NRI's Synchronize lists with their mounts, and watches the claim as before."""
    containerd = cdi_containerd
    prepare_claim(hcsd, "4Gi")
    pod = containerd.run_pod("trainer", "team-a", "uid-5")
    main = containerd.create_container(pod, "main", cdi_devices=[CDI_ID])
    containerd.start(main)
    assert hcsd.process is not None
    hcsd.process.kill()
    hcsd.process.wait()
    Path(hcsd.socket).unlink(missing_ok=True)
    hcsd.start()
    wait_for(lambda: hcsd.logs().count("nri: synchronized") >= 2, "Synchronize after the restart")
    gpu.add_process(0, pid_of(containerd, main), 6 * GiB)
    assert containerd.wait_exited(main, timeout=10) == 137
    wait_for(
        lambda: re.search(rf"claim team-a/train-gpu \(claim-{UID}\): holds 6Gi", hcsd.logs()),
        "hcsd logged the kill",
    )


# What a second uid in the claim's container tries: grow the claim's limit, rewrite what
# libhcs accounted (the region's header and totals), change their modes.
MEDDLE = """
echo 'device.0.vram_limit=999999999999' > /run/hcs/quota.conf; echo "rewrite quota=$?"
chmod 0666 /run/hcs/quota.conf; echo "chmod quota=$?"
printf 'HACKED' | dd of=/run/hcs/usage.shm bs=1 seek=32 conv=notrunc 2>/dev/null
echo "write region=$?"
chmod 0666 /run/hcs/usage.shm; echo "chmod region=$?"
"""


def test_another_uid_in_a_claims_container_cannot_rewrite_its_limits_or_usage(
    cdi_containerd: Containerd, hcsd: Daemon
) -> None:
    containerd = cdi_containerd
    prepare_claim(hcsd, "4Gi")
    directory = hcsd.dir / "claims" / f"claim-{UID}"
    quota = (directory / "quota.conf").read_text()
    region = (directory / "usage.shm").read_bytes()
    pod = containerd.run_pod("notebook", "team-a", "uid-3")
    ctr = containerd.create_container(pod, "main", cdi_devices=[CDI_ID], user=(1000, 1000))
    # Given to the container's user before any of its processes runs, as in extender mode.
    shm = (directory / "usage.shm").stat()
    assert (shm.st_uid, shm.st_gid, shm.st_mode & 0o777) == (1000, 1000, 0o644)
    containerd.start(ctr)
    # The container's own user may write the region (libhcs accounts there), not the quota.
    assert containerd.exec(ctr, "sh", "-c", "test -w /run/hcs/usage.shm") == (0, "")
    rewrite = "echo 'device.0.vram_limit=1' > /run/hcs/quota.conf; echo rewrite quota=$?"
    _, out = containerd.exec(ctr, "sh", "-c", rewrite)
    assert "rewrite quota=1" in out, out
    _, out = containerd.exec(ctr, "sh", "-c", MEDDLE, user="1001:1001")
    assert "rewrite quota=1" in out and "chmod quota=1" in out, out
    assert "write region=1" in out and "chmod region=1" in out, out
    assert (directory / "quota.conf").read_text() == quota
    assert (directory / "usage.shm").read_bytes() == region


def test_a_claims_containers_running_as_different_users_share_a_writable_region(
    cdi_containerd: Containerd, hcsd: Daemon
) -> None:
    """The claim's one region must stay writable by each of its containers' users: with two
    users it is root's 0666 (the extender mode's fallback for an unknown user), said in the log."""
    containerd = cdi_containerd
    prepare_claim(hcsd, "4Gi")
    shm = hcsd.dir / "claims" / f"claim-{UID}" / "usage.shm"
    pod = containerd.run_pod("notebook", "team-a", "uid-4")
    containerd.create_container(pod, "main", cdi_devices=[CDI_ID], user=(1000, 1000))
    assert (shm.stat().st_uid, shm.stat().st_mode & 0o777) == (1000, 0o644)
    containerd.create_container(pod, "sidecar", cdi_devices=[CDI_ID], user=(2000, 2000))
    assert (shm.stat().st_uid, shm.stat().st_mode & 0o777) == (0, 0o666)
    assert "runs as uid 2000 gid 2000, another container of" in hcsd.logs()
