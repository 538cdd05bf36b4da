"""The simulated accelerator nodes of the kubelet cluster: what hcsd discovers, the device
nodes, and the vendor's driver files where a real driver installs them.

hcsd's simulated backend reads the node file; the device nodes it names borrow /dev/null's
numbers (1:3), so they exist in the node's /dev (bind mounts of /dev/null) and runc creates
working nodes in the container. The driver files are the fake vendor libraries, which follow
the vendors' real ABIs: tests/fakes' libcuda.so.1 in /usr/local/nvidia/lib64 (the NVIDIA
driver directory hcsd mounts) and libhcs's fake libascendcl.so in
/usr/local/Ascend/driver/lib64 (a real install has ACL in the CANN toolkit, not the driver
directory: it is here so that hcsd's Ascend driver mount carries it). Each driver directory
also holds a `hcs-test-driver` file naming its node, which the container must see.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tests.fakes import BUILD as FAKES_BUILD
from tests.harness.daemon import ROOT

LIBHCS_FAKES = ROOT / "libhcs" / "build" / "tests" / "fakes"
NULL_NUMBERS = "1:3"


@dataclass(frozen=True)
class Peer:
    """A further device of the node's model, at the next index (a node with several)."""

    uuid: str
    device_nodes: tuple[str, ...]
    pci_bus_id: str


@dataclass(frozen=True)
class VendorNode:
    """One simulated node: its vendor's names and files."""

    vendor: str  # as hcsd names it (nvidia, ascend)
    api: str  # alloc_app's name for the vendor's allocation API (cuda, acl)
    model: str
    uuid: str
    vram: str
    tflops: float
    device_nodes: tuple[str, ...]  # the device's own
    shared_nodes: tuple[str, ...]  # the vendor's control nodes, given with any device
    install_dir: str  # the driver's install directory on the node
    library: str  # the fake library, relative to install_dir (in a path hcsd mounts)
    marker: str  # a file naming the node, relative to install_dir (in a path hcsd mounts)
    fake: Path  # where it is built
    env: tuple[tuple[str, str], ...]  # what the container must get
    oom_code: int  # the API's own code for an allocation that does not fit
    # The device's PCI address in the node file: what kernel lines name it by (a test that
    # writes them to the host's /dev/kmsg gives its nodes addresses of their own).
    pci_bus_id: str = "0000:17:00.0"
    # Devices after the first (index 1, 2, ...), and the fabric links between devices by
    # index (`(1, 2, "nvlink")`: one island, hcsd's linkDomain). The first device is the one
    # the fields above describe, and the one every single-device test expects.
    peers: tuple[Peer, ...] = ()
    links: tuple[tuple[int, int, str], ...] = ()

    def node_file(self, counters: Mapping[str, int] | None = None) -> str:
        """hcsd's node file; `counters`: the simulated health counters of every device."""
        shared = ", ".join(f'"{n}:{NULL_NUMBERS}"' for n in self.shared_nodes)
        text = f"[shared_nodes]\n{self.vendor} = [{shared}]\n"
        first = Peer(self.uuid, self.device_nodes, self.pci_bus_id)
        for index, device in enumerate((first, *self.peers)):
            nodes = ", ".join(f'"{n}:{NULL_NUMBERS}"' for n in device.device_nodes)
            text += (
                f'\n[[device]]\nuuid = "{device.uuid}"\nvendor = "{self.vendor}"\n'
                f'model = "{self.model}"\nindex = {index}\npci_bus_id = "{device.pci_bus_id}"\n'
                f'vram = "{self.vram}"\ntflops_fp16 = {self.tflops}\nnodes = [{nodes}]\n'
            )
            if counters is not None:
                text += f"counters = {{ {', '.join(f'{k} = {v}' for k, v in counters.items())} }}\n"
        uuids = [self.uuid, *(p.uuid for p in self.peers)]
        for a, b, kind in self.links:
            text += f'\n[[link]]\na = "{uuids[a]}"\nb = "{uuids[b]}"\nkind = "{kind}"\ngbps = 600\n'
        return text

    def all_device_nodes(self) -> tuple[str, ...]:
        """The first device's nodes and the vendor's shared ones: what a container given
        that device sees."""
        return self.device_nodes + self.shared_nodes

    def node_devices(self) -> tuple[str, ...]:
        """Every device node of the node (each device's and the shared ones)."""
        return self.all_device_nodes() + tuple(n for p in self.peers for n in p.device_nodes)

    def driver_tree(self, into: Path, node_name: str) -> Path:
        """The install directory's contents in `into` (bound at `install_dir` on the node)."""
        library = into / self.library
        library.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.fake, library)
        (into / self.marker).write_text(self.marker_text(node_name))
        return into

    def marker_text(self, node_name: str) -> str:
        return f"{self.vendor} driver of {node_name}\n"


NVIDIA = VendorNode(
    vendor="nvidia",
    api="cuda",
    model="A100-SXM4-80GB",
    uuid="GPU-6b1c0e52-kube-4c11-9d2e-a100a100a000",
    vram="80Gi",
    tflops=312,
    device_nodes=("/dev/nvidia0",),
    shared_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm"),
    install_dir="/usr/local/nvidia",
    library="lib64/libcuda.so.1",
    marker="hcs-test-driver",
    fake=FAKES_BUILD / "libcuda.so.1",
    env=(
        ("NVIDIA_VISIBLE_DEVICES", "GPU-6b1c0e52-kube-4c11-9d2e-a100a100a000"),
        ("CUDA_VISIBLE_DEVICES", "GPU-6b1c0e52-kube-4c11-9d2e-a100a100a000"),
        ("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64"),
    ),
    oom_code=2,  # CUDA_ERROR_OUT_OF_MEMORY
)

#: Three A100s: the first alone, the other two joined by NVLink (island `nvidia-nvlink-1`).
#: A claim for two devices on one link domain must take the pair, though the first comes
#: first in the slice and is free.
A100_ISLAND = replace(
    NVIDIA,
    peers=tuple(
        Peer(
            f"GPU-6b1c0e52-kube-4c11-9d2e-a100a100a00{i}",
            (f"/dev/nvidia{i}",),
            f"0000:{17 + i}:00.0",
        )
        for i in (1, 2)
    ),
    links=((1, 2, "nvlink"),),
)

ASCEND = VendorNode(
    vendor="ascend",
    api="acl",
    model="Ascend910B3",
    uuid="NPU-910b-kube-0000-0000-000000000000",
    vram="64Gi",
    tflops=313,
    device_nodes=("/dev/davinci0",),
    shared_nodes=("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
    install_dir="/usr/local/Ascend",
    library="driver/lib64/libascendcl.so",
    marker="driver/lib64/hcs-test-driver",
    fake=LIBHCS_FAKES / "libascendcl.so",
    env=(
        ("ASCEND_VISIBLE_DEVICES", "0"),
        ("ASCEND_RT_VISIBLE_DEVICES", "0"),
        ("LD_LIBRARY_PATH", "/usr/local/Ascend/driver/lib64"),
    ),
    oom_code=207001,  # ACL_ERROR_RT_MEMORY_ALLOCATION
)


def build_fakes() -> str | None:
    """Build the fake libraries and alloc_app; None, or why they cannot be built."""
    for command in (
        ["make", "-s", "-C", str(ROOT / "tests" / "fakes")],
        ["make", "-s", "-C", str(ROOT / "libhcs")],
        # the tests' Makefile names its targets by absolute path (LIB may be build-arm64)
        ["make", "-s", "-C", str(ROOT / "libhcs" / "tests"), str(LIBHCS_FAKES / "libascendcl.so")],
    ):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {(done.stdout + done.stderr)[-800:]}"
    return None
