"""Fixtures for the watchdog: the fake vendor libraries, real cgroups, GPU workloads.

A "GPU node" here is the fake NVML (tests/fakes/fake_nvml.c) over the fake CUDA driver
(fake_cuda.c): a workload (`gpu_app`) allocates through the driver, the driver publishes what
each process holds, NVML reports it per process, as the real pair does. Workloads run in real
cgroups laid out like runtimes' (tests/watchdog/cgroup.py), so pids, cgroup paths and kills
are all real.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hcsd.contract.quota_file import render_quota
from hcsd.model import Allocation, Device, Grant, PodRef, Vendor
from tests.fakes import write_config
from tests.harness.daemon import build_libhcs
from tests.watchdog.cgroup import Container, Containers, cgroup_roots

GiB = 2**30
UUIDS = [f"GPU-00000000-0000-0000-0000-{i:012x}" for i in range(8)]


@pytest.fixture(scope="session")
def libhcs() -> Path:
    try:
        return build_libhcs()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"libhcs cannot be built: {e}")


@pytest.fixture
def containers() -> Iterator[Containers]:
    if os.geteuid() != 0:
        pytest.skip("NOT ROOT: the watchdog tests make cgroups and kill processes in them")
    roots = cgroup_roots()
    if not roots:
        pytest.skip("no writable cgroup v2 or v1 pids hierarchy is mounted")
    made = Containers(roots)
    yield made
    made.close()


def gpu_devices(count: int = 2) -> list[Device]:
    return [
        Device(
            uuid=UUIDS[i],
            vendor=Vendor.NVIDIA,
            model="A100-SXM4-80GB",
            index=i,
            pci_bus_id=f"0000:{0x17 + 0x10 * i:02x}:00.0",
            vram_bytes=80 * GiB,
        )
        for i in range(count)
    ]


@dataclass
class GpuNode:
    """The fake NVML's config and the fake driver's state directory, set in this process's
    environment (where the reader loads NVML) and handed to workloads."""

    root: Path
    library: Path
    config: Path
    state: Path
    records: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    def write(self) -> None:
        write_config(self.config, self.records)
        os.utime(self.config, ns=(time.time_ns(), time.time_ns()))  # the fake re-reads on mtime

    def add_process(self, device: int, pid: int, used: int, kind: str = "compute") -> None:
        self.records.append(("process", {"device": device, "pid": pid, "used": used, "kind": kind}))
        self.write()

    def workload_env(self, device: int = 0, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(self.library.parent),
            "FAKE_GPU_STATE": str(self.state),
            "CUDA_VISIBLE_DEVICES": UUIDS[device],
        }
        env.update(extra)
        return env


def make_gpu_node(root: Path, libs: Path, monkeypatch: pytest.MonkeyPatch) -> GpuNode:
    """Two fake GPUs (UUIDS[0], UUIDS[1]) under `root`, set in this process's environment."""
    state = root / "gpu-state"
    state.mkdir()
    node = GpuNode(root, libs / "libnvidia-ml.so.1", root / "nvml.conf", state)
    for i, uuid in enumerate(UUIDS[:2]):
        node.records.append(
            (
                "device",
                {
                    "uuid": uuid,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "bus": f"00000000:{0x17 + 0x10 * i:02x}:00.0",
                    "memory": 80 * GiB,
                    "used": 0,
                    "minor": i,
                },
            )
        )
    node.write()
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    monkeypatch.setenv("FAKE_GPU_STATE", str(state))
    return node


@pytest.fixture
def gpu_node(tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch) -> GpuNode:
    return make_gpu_node(tmp_path, fake_libs, monkeypatch)


def allocation(
    container: Container | str, grants: dict[int, int], *, pod: str = "", name: str = "main"
) -> Allocation:
    """An allocation of `grants` (device index -> bytes) for a container."""
    cid = container if isinstance(container, str) else container.id
    return Allocation(
        container_id=cid,
        grants=tuple(Grant(UUIDS[i], size) for i, size in grants.items()),
        pod=PodRef("team-a", pod, "uid-" + pod) if pod else PodRef(),
        container_name=name if pod else "",
    )


def quota_dir(run_dir: Path, held: Allocation) -> Path:
    """The per-container directory hcsd prepares: quota.conf (libhcs's region goes beside)."""
    directory = run_dir / "containers" / held.container_id
    directory.mkdir(parents=True, exist_ok=True)
    devices = [d for d in gpu_devices(8) if d.uuid in held.device_uuids]
    by_uuid = {d.uuid: d for d in devices}
    text = render_quota(held.container_id, held.grants, [by_uuid[u] for u in held.device_uuids])
    (directory / "quota.conf").write_text(text)
    return directory


def allocated(process: subprocess.Popen[bytes]) -> str:
    """The workload's `allocated K of N` line (printed once its allocations are done)."""
    assert process.stdout is not None
    return process.stdout.readline().decode().strip()
