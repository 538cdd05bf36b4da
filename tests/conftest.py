"""Shared fixtures: the simulated mixed node and small device builders; the real-kubelet
cluster (`kubelet_cluster`, tests/harness/kubecluster) and HCS's cluster image
(`cluster_image`, tests/harness/images.py) for any suite that asks for them."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.discovery import Inventory, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.ledger import Ledger
from hcsd.model import Device, HealthState, Link, LinkKind, Vendor
from tests.fakes import build_fakes
from tests.harness.daemon import MIXED_NODE, ROOT
from tests.harness.images import cluster_image  # noqa: F401 - for every suite
from tests.harness.kubecluster.fixture import (  # noqa: F401 - for every suite
    bare_kubelet_cluster,
    healing_kubelet_cluster,
    kubelet_cluster,
    stamped_bare_kubelet_cluster,
)

GiB = 2**30


@pytest.fixture(scope="session")
def fake_libs() -> Path:
    """The fake vendor libraries (tests/fakes), built once per session."""
    build = build_fakes()
    if build is None:
        pytest.skip("NO C COMPILER: the fake vendor libraries cannot be built")
    return build


@pytest.fixture
def mixed_inventory() -> Inventory:
    return discover_all("sim", [SimulatedBackend(MIXED_NODE)])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(str(tmp_path / "state"))
    ledger.open()
    yield ledger
    ledger.close()


def gpu(
    index: int,
    *,
    vram_gib: int = 80,
    model: str = "A100-SXM4-80GB",
    vendor: Vendor = Vendor.NVIDIA,
    tflops: float = 312.0,
    links: tuple[tuple[int, LinkKind, float], ...] = (),
    health: HealthState = HealthState.HEALTHY,
    score: int = 100,
) -> Device:
    """A device named `dev-<index>` with links given as (peer index, kind, GB/s)."""
    return Device(
        uuid=f"dev-{index}",
        vendor=vendor,
        model=model,
        index=index,
        pci_bus_id=f"0000:{index:02x}:00.0",
        vram_bytes=vram_gib * GiB,
        tflops_fp16=tflops,
        links=tuple(Link(f"dev-{peer}", kind, gbps) for peer, kind, gbps in links),
        health_state=health,
        health_score=score,
    )


BPF_DIR = ROOT / "bpf"
BPF_BUILD = BPF_DIR / "build"


def _why_no_bpf_build() -> str | None:
    for tool in ("clang", "bpftool", "make", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt install clang llvm libbpf-dev bpftool)"
    if not os.path.exists("/usr/include/bpf/bpf_helpers.h"):
        return "libbpf headers missing (apt install libbpf-dev)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "kernel has no BTF at /sys/kernel/btf/vmlinux"
    return None


@pytest.fixture(scope="session")
def bpf_objects() -> Path:
    """Build bpf/ once per session; skip loudly when the toolchain or BTF is missing."""
    reason = _why_no_bpf_build()
    if reason is not None:
        pytest.skip(f"eBPF objects cannot be built here: {reason}")
    result = subprocess.run(
        ["make", "-s", "-C", str(BPF_DIR)], capture_output=True, text=True, check=False, timeout=300
    )
    if result.returncode != 0:
        pytest.fail(f"make -C bpf failed:\n{result.stdout}\n{result.stderr}")
    return BPF_BUILD


@pytest.fixture
def kmsg_writer() -> Iterator[object]:
    """Write lines to the real /dev/kmsg with the user-write rate limit lifted meanwhile."""
    if os.geteuid() != 0:
        pytest.skip("writing crafted kernel lines needs root")
    control = Path("/proc/sys/kernel/printk_devkmsg")
    before = control.read_text().strip() if control.exists() else None
    if before is not None:
        control.write_text("on\n")

    def write(line: str, level: int = 3) -> None:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<{level}>{line}\n")

    yield write
    if before is not None:
        control.write_text(before + "\n")
