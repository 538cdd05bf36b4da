"""Container ids from cgroup paths as runtimes write them, and pids mapped through real cgroups."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hcsd.watchdog.cgroups import CgroupMapper, CgroupMount, container_ids, container_path, owner
from tests.watchdog.cgroup import Containers

A = "a" * 56 + "0123abcd"
B = "b" * 64


@pytest.mark.parametrize(
    ("path", "ids"),
    [
        pytest.param(f"/kubepods/burstable/pod1234-5678/{A}", (A,), id="containerd-cgroupfs"),
        pytest.param(f"/k8s.io/{A}", (A,), id="containerd-namespace"),
        pytest.param(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/"
            f"cri-containerd-{A}.scope",
            (A,),
            id="containerd-systemd",
        ),
        pytest.param(f"/kubepods.slice/crio-{A}.scope", (A,), id="crio-systemd"),
        pytest.param(f"/kubepods.slice/crio-conmon-{A}.scope", (), id="crio-monitor-is-not-it"),
        pytest.param(f"/machine.slice/libpod-conmon-{A}.scope", (), id="podman-monitor"),
        pytest.param(f"/machine.slice/libpod-{A}.scope/container", (A,), id="podman-nested"),
        pytest.param(f"/system.slice/docker-{A}.scope", (A,), id="docker-systemd"),
        pytest.param(f"/docker/{A}", (A,), id="docker-cgroupfs"),
        pytest.param(f"/system.slice/runc-{A}.scope", (A,), id="runc-systemd"),
        pytest.param(f"/kubepods/pod1/{A}/{B}", (A, B), id="sub-cgroup-named-like-another"),
        pytest.param(f"/kubepods/pod1/{A.upper()}", (), id="upper-case-is-not-an-id"),
        pytest.param(f"/kubepods/pod1/{A}0", (), id="65-digits"),
        pytest.param("/user.slice/user-0.slice/session-3.scope", (), id="a-login-session"),
        pytest.param("/", (), id="root"),
    ],
)
def test_container_ids_in_cgroup_paths(path: str, ids: tuple[str, ...]) -> None:
    assert container_ids(path) == ids


def test_the_outermost_container_with_a_grant_is_charged() -> None:
    # A container with a writable cgroup made a sub-cgroup named after container B: its
    # processes are still charged to A, which holds a grant and encloses them.
    assert owner((A, B), {A, B}) == A
    assert owner((A, B), {B}) == B  # A is not ours (say, a kind node): the inner one is
    assert owner((A,), {B}) is None
    assert container_path(f"/kubepods/pod1/{A}/{B}/x", A) == f"/kubepods/pod1/{A}"
    assert container_path(f"/kubepods/pod1/{A}", B) is None


@pytest.mark.parametrize(
    ("mount", "hierarchy", "path", "directory"),
    [
        pytest.param(
            CgroupMount(True, frozenset(), "/sys/fs/cgroup", "/"),
            "",
            "/kubepods/x",
            "/sys/fs/cgroup/kubepods/x",
            id="v2",
        ),
        pytest.param(
            CgroupMount(False, frozenset({"rw", "cpu", "cpuacct"}), "/sys/fs/cgroup/cpu", "/"),
            "cpuacct,cpu",
            "/kubepods/x",
            "/sys/fs/cgroup/cpu/kubepods/x",
            id="v1-joined-controllers",
        ),
        pytest.param(
            CgroupMount(True, frozenset(), "/sys/fs/cgroup", "/kubepods"),
            "",
            "/kubepods/x",
            "/sys/fs/cgroup/x",
            id="mounted-from-a-sub-cgroup",
        ),
        pytest.param(
            CgroupMount(True, frozenset(), "/sys/fs/cgroup", "/kubepods"),
            "",
            "/system.slice/x",
            None,
            id="outside-the-mount",
        ),
    ],
)
def test_cgroup_directories_under_mounts(
    mount: CgroupMount, hierarchy: str, path: str, directory: str | None
) -> None:
    assert mount.serves(hierarchy)
    assert mount.directory(path) == directory


def test_mounts_are_read_from_mountinfo(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text(
        "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
        "35 24 0:30 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        "36 24 0:31 /sub /mnt/with\\040space rw - cgroup cgroup rw,name=systemd,xattr\n"
        "40 24 0:5 / /dev rw shared:2 - devtmpfs udev rw\n"
        "garbage line\n"
    )
    mounts = CgroupMapper(tmp_path).mounts()
    assert [(m.v2, m.mount_point, m.root) for m in mounts] == [
        (True, "/sys/fs/cgroup", "/"),
        (False, "/sys/fs/cgroup/cpu,cpuacct", "/"),
        (False, "/mnt/with space", "/sub"),
    ]
    assert mounts[2].serves("name=systemd") and not mounts[2].serves("memory")


def test_a_real_process_is_mapped_to_its_container(containers: Containers) -> None:
    container = containers.new()
    process = container.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    mapper = CgroupMapper()
    assert mapper.ids(process.pid) == (container.id,)
    assert mapper.ids(os.getpid()) == ()  # the test itself is in no container
    child = container.spawn(["sleep", "60"], sub=B)  # a sub-cgroup it made, named like B
    assert mapper.ids(child.pid) == (container.id, B)
    process.kill()
    process.wait()
    assert mapper.ids(process.pid) is None  # gone (and reaped)


def test_cgroup_file_of_a_process_that_is_gone_or_odd(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(
        f"12:pids:/kubepods/pod1/{A}\n0::/\nnot a line\n5:memory:relative/{B}\n"
    )
    mapper = CgroupMapper(tmp_path)
    assert mapper.ids(7) == (A,)  # the v2 line names nothing, a v1 line does
    assert mapper.ids(8) is None
    assert list(mapper.pids()) == [7]
