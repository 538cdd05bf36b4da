"""The images of a RuntimeProfile on the kubelet cluster: one base image per vendor and one
code image, written as OCI layout tarballs by tests/runtime/image.py and imported into each
node's containerd (no registry is reachable here).

A base image stands in for PyTorch-CUDA or torch_npu: busybox, the host's glibc (as a real
base image carries its own libc; libhcs and the fake vendor libraries the node injects are
built against it), `/etc/hcs-base` naming the vendor, an `LD_LIBRARY_PATH` of its own (as NGC
and CANN images set one), and the framework's stand-in: tests/fakes' alloc_app as
/usr/local/bin/alloc_app behind `device-alloc`, which allocates through the vendor's own API
(cuMemAlloc_v2 from libcuda.so.1, aclrtMalloc from libascendcl.so) found the way the vendor's
runtime finds it, in the driver library the node injects. A user's script calls `device-alloc`
the way a training script calls `torch.empty(..., device=...)`: without naming the vendor.

The code image holds only the user's code (train.sh and serve.sh, stand-ins of train.py and
an inference server) and is mounted as a Kubernetes image volume (`volumes[].image`, GA and
locked on in kubelet 1.36; containerd 2.3's CRI mounts it): the same for every vendor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.fakes import BUILD as FAKES_BUILD
from tests.runtime.image import File, ensure_image

LIBC_DIR = Path("/lib/x86_64-linux-gnu")
LIBC = ("libc.so.6",)  # all that alloc_app, libhcs and the fake vendor libraries need
LOADER = "ld-linux-x86-64.so.2"
CODE_IMAGE = "docker.io/hcs/demo-code:v1"
#: What a pod names as its container's image before the extender rebinds it: imported
#: nowhere, so a pod that was not rebound cannot start (ErrImageNeverPull names it).
PLACEHOLDER_IMAGE = "docker.io/hcs/rebound-at-bind:placeholder"
CODE_MARKER = "demo-code v1\n"


@dataclass(frozen=True)
class BaseImage:
    """A vendor's base image as the test builds it and checks it from inside."""

    vendor: str
    name: str
    api: str  # alloc_app's name for the vendor's allocation API
    library_path: str  # the image's own LD_LIBRARY_PATH

    def marker(self) -> str:
        return f"vendor={self.vendor} image={self.name}\n"


BASE_IMAGES = {
    "nvidia": BaseImage(
        "nvidia", "docker.io/hcs/pytorch-cuda:test", "cuda", "/usr/local/cuda/lib64"
    ),
    "ascend": BaseImage(
        "ascend", "docker.io/hcs/pytorch-npu:test", "acl", "/usr/local/Ascend/ascend-toolkit/lib64"
    ),
}

TRAIN = """#!/bin/sh
# train.py's stand-in: the job holds 4 GiB of device memory through the framework's
# allocator until it is stopped, and says what it ran on.
echo "train: base $(cat /etc/hcs-base)"
device-alloc --hold 4096 > /tmp/train.log 2>&1 &
trap 'kill $!; exit 0' TERM
wait
"""

SERVE = """#!/bin/sh
# An inference server's stand-in: prints the arguments it was started with, then serves
# (sleeps) until it is stopped.
echo "serve: $*"
trap 'exit 0' TERM
sleep 3600 &
wait
"""


def _glibc() -> dict[str, File]:
    files = {
        f"lib/x86_64-linux-gnu/{name}": File((LIBC_DIR / name).read_bytes(), 0o755)
        for name in (*LIBC, LOADER)
    }
    files[f"lib64/{LOADER}"] = File(link=f"/lib/x86_64-linux-gnu/{LOADER}")
    return files


def ensure_base_image(vendor: str) -> Path:
    """The vendor's base image tarball (tests/fakes must be built: alloc_app)."""
    base = BASE_IMAGES[vendor]
    alloc = f'#!/bin/sh\nexec /usr/local/bin/alloc_app {base.api} "$@"\n'
    files = {
        **_glibc(),
        "etc/hcs-base": File(base.marker().encode()),
        "usr/local/bin/alloc_app": File((FAKES_BUILD / "alloc_app").read_bytes(), 0o755),
        "usr/local/bin/device-alloc": File(alloc.encode(), 0o755),
        "bin/tr": File(link="busybox"),  # the test's probe reads /proc/1/environ with it
    }
    env = (f"LD_LIBRARY_PATH={base.library_path}",)
    return ensure_image(f"base-{vendor}", base.name, ["sh"], files, env=env)


def ensure_code_image() -> Path:
    """The code image: the user's scripts and a marker, nothing else (no shell, no libc)."""
    files = {
        "train.sh": File(TRAIN.encode(), 0o755),
        "serve.sh": File(SERVE.encode(), 0o755),
        "hcs-code": File(CODE_MARKER.encode()),
    }
    return ensure_image("code", CODE_IMAGE, [], files, with_busybox=False)
