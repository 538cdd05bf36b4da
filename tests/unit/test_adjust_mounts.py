"""hcsd's mounts in the NRI adjustment next to the container's own: none below a bind of the
container's (runc would create its mount point in that host directory), one at the same
destination replaces the container's."""

from __future__ import annotations

import pytest

from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.edits import ContainerEdits, MountEdit
from hcsd.runtime.nri.adjust import adjustment

LIB = "/usr/local/nvidia/lib64"


def test_a_mount_below_the_containers_own_bind_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    edits = ContainerEdits(
        mounts=(
            MountEdit("/host/libcuda.so.1", f"{LIB}/libcuda.so.1"),
            MountEdit("/run/hcsd/preload", "/etc/ld.so.preload"),
            MountEdit("/host/nvidia-smi", "/usr/bin/nvidia-smi"),
        )
    )
    own = (
        ContainerMount("/usr/local/nvidia/", "/srv/tenant-volume"),  # a hostPath volume
        ContainerMount("/etc/ld.so.preload", "/srv/theirs"),  # ours replaces it
        ContainerMount("/usr", "", bind=False, kind="tmpfs"),  # no host directory below
    )
    adjusted = adjustment(edits, [], own)
    assert [m.destination for m in adjusted.mounts] == ["/etc/ld.so.preload", "/usr/bin/nvidia-smi"]
    assert f"not mounting '{LIB}/libcuda.so.1'" in caplog.text
    assert len(adjustment(edits).mounts) == 3
