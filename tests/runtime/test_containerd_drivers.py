"""Against a real containerd with runc: the NVIDIA driver's libraries of a fake host (found
through its ld.so cache, no CDI spec) inside the container read-only in hcsd's own library
directory, and the image's own LD_LIBRARY_PATH kept behind it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import Daemon
from tests.harness.fake_driver import LIB_DIR, VERSION, fake_driver
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd
from tests.runtime.node import runtime_hcsd, start_registered

pytestmark = pytest.mark.slow

LIBS = "/usr/local/nvidia/lib64"  # hcsd's own directory, first in LD_LIBRARY_PATH
INSPECT = (
    "echo ld=$LD_LIBRARY_PATH; "
    f"stat -L -c 'size %s' {LIBS}/libcuda.so.1; "
    f"head -c 4 {LIBS}/libcuda.so.1 | od -An -c; "
    f"grep ' {LIBS}/libcuda.so.1 ' /proc/self/mountinfo; "
    f"(echo x >> {LIBS}/libcuda.so.1) 2>/dev/null && echo WRITABLE || echo readonly; "
    "nvidia-smi; echo done"
)


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    host = tmp_path / "host"
    fake_driver(host)
    daemon = runtime_hcsd(
        tmp_path / "hcsd",
        containerd.nri_socket,
        settings={
            "runtime.driver_paths": {"nvidia": []},
            "runtime.driver_paths.nvidia_files": {"driver_root": str(host)},
        },
    )
    start_registered(daemon)
    yield daemon
    daemon.close()


def test_driver_files_and_the_images_library_path(
    containerd: Containerd, hcsd: Daemon, tmp_path: Path
) -> None:
    pod = containerd.run_pod("trainer", "team-a", "uid-drv")
    ctr = containerd.create_container(
        pod,
        "main",
        command=["sh", "-c", INSPECT],
        env={"LD_LIBRARY_PATH": "/opt/conda/lib"},
        annotations={"hcs.io/vram": "8Gi"},
    )
    spec = containerd.runtime_spec(ctr)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    real = tmp_path / "host" / LIB_DIR / f"libcuda.so.{VERSION}"
    for inside in (f"{LIBS}/libcuda.so.1", f"{LIBS}/libcuda.so.{VERSION}"):
        assert mounts[inside]["source"] == str(real)
        assert "ro" in mounts[inside]["options"]
    containerd.start(ctr)
    wait_for(lambda: "done" in containerd.logs(ctr), "the container ran")
    out = containerd.logs(ctr)
    assert f"ld={LIBS}:/opt/conda/lib" in out  # the loader finds libcuda.so.1 by its soname
    assert f"size {real.stat().st_size}" in out
    assert "E   L   F" in out  # the real shared object
    assert out.split(f" {LIBS}/libcuda.so.1 ", 1)[1].startswith("ro,")  # a read-only mount
    assert "readonly" in out and "WRITABLE" not in out
    assert "fake nvidia-smi" in out
    containerd.stop_container(ctr)
    containerd.remove_container(ctr)
