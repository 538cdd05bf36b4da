"""The per-container quota files on the host, handled as hcsd's unit handles them: without
CAP_DAC_OVERRIDE or CAP_FOWNER (tests/capabilities.py), whatever a container left behind.

An older hcsd mounted the whole per-container directory at /run/hcs, so directories on an
upgraded node may hold what a root container made there: a `chmod 0555`, sub-directories,
symbolic links, FIFOs, sparse files of a terabyte. Removing one must succeed or be reported,
and never stop the reconcile of the others; a planted link must never redirect a write.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hcsd.contract import region
from hcsd.discovery import Inventory
from hcsd.model import Allocation, FrontEnd, Grant, PodRef
from hcsd.runtime.container_files import ContainerUser, QuotaFiles
from hcsd.runtime.dirfd import MAX_DEPTH, opened_dir, remove_tree
from hcsd.runtime.injector import ContainerInfo, Injector
from hcsd.service import NodeService
from hcsd.watchdog.accounted import AccountedUsage
from tests.capabilities import as_unit
from tests.conftest import GiB
from tests.harness.local import local_node
from tests.harness.peers.runtimes import Binaries

A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"
PRELOAD = b"/usr/lib/hcs/libhcs.so\n"


@dataclass
class Node:
    injector: Injector
    service: NodeService
    quota: QuotaFiles
    run_dir: Path

    def container(self, cid: str) -> Path:
        return self.run_dir / "containers" / cid


@pytest.fixture
def node(tmp_path: Path, mixed_inventory: Inventory) -> Iterator[Node]:
    local = local_node(tmp_path, mixed_inventory)
    injector = local.injector()
    yield Node(injector, local.service, injector.quota, local.run_dir)
    local.close()


def prepare(node: Node, cid: str, user: ContainerUser | None = None) -> None:
    device = node.service.device(A100_0)
    assert device is not None
    node.quota.prepare(cid, [Grant(A100_0, GiB)], [device], user)


def leftover(directory: Path, outside: Path, *, depth: int = 8) -> None:
    """What a root container could leave in the directory an older hcsd mounted at /run/hcs."""
    directory.mkdir(parents=True)
    (directory / "quota.conf").write_text("version=1\n")
    (directory / "usage.shm").write_bytes(b"\0" * 64)
    os.mkfifo(directory / "fifo")
    (directory / "outside").symlink_to(outside)
    (directory / "outside-dir").symlink_to(outside.parent, target_is_directory=True)
    with open(directory / "huge", "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that takes no room
    nested = directory
    for level in range(depth):
        nested = nested / f"d{level}"
        nested.mkdir()
        (nested / "file").write_text("x")
    for path in sorted(directory.rglob("d*"), key=lambda p: len(p.parts), reverse=True):
        path.chmod(0o555)
    directory.chmod(0o555)  # `chmod 0555 /run/hcs` from inside


def test_a_directory_a_container_made_read_only_is_removed(node: Node, tmp_path: Path) -> None:
    """The unit has no CAP_DAC_OVERRIDE: shutil.rmtree failed here with PermissionError, and
    the Synchronize that tried it failed with it."""
    outside = tmp_path / "precious"
    outside.write_text("keep")
    leftover(node.container("c1"), outside)
    assert as_unit(lambda: node.quota.remove("c1")) is True
    assert not node.container("c1").exists()
    assert outside.read_text() == "keep" and (tmp_path / "run").is_dir()


def test_what_cannot_be_removed_is_reported_and_the_reconcile_goes_on(
    node: Node, tmp_path: Path
) -> None:
    """A sub-directory owned by another uid and read-only: hcsd cannot empty it (no
    CAP_FOWNER). It is logged and left; the other leftovers and allocations are reconciled."""
    outside = tmp_path / "precious"
    outside.write_text("keep")
    stuck = node.container("stuck")
    stuck.mkdir(parents=True)
    foreign = stuck / "theirs"
    foreign.mkdir()
    (foreign / "file\nforged log line").write_text("x")
    os.chown(foreign, 1000, 1000)
    foreign.chmod(0o555)
    leftover(node.container("other"), outside)
    grants = (Grant(A100_0, GiB),)
    node.service.hold(Allocation("gone", grants, source="local", front_end=FrontEnd.NRI))
    prepare(node, "gone")

    def reconcile() -> tuple[list[str], bool, list[str]]:
        messages: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("hcsd").addHandler(handler)
        logging.getLogger("hcsd").setLevel(logging.INFO)
        released = node.injector.reconcile([], FrontEnd.NRI)
        return released, node.service.allocation("gone") is None, messages

    released, gone, messages = as_unit(reconcile)
    assert released == ["gone"] and gone
    assert sorted(p.name for p in (node.run_dir / "containers").iterdir()) == ["stuck"]
    assert (foreign / "file\nforged log line").exists()
    left = [m for m in messages if m.startswith("stuck: cannot remove all of its quota directory")]
    assert len(left) == 1, messages
    assert "stuck/theirs/file\\nforged log line: Permission denied" in left[0], left  # escaped


def test_a_tree_deeper_than_the_limit_is_reported_not_walked(node: Node, tmp_path: Path) -> None:
    leftover(node.container("deep"), tmp_path / "x", depth=MAX_DEPTH + 2)
    assert as_unit(lambda: node.quota.remove("deep")) is False
    assert node.container("deep").is_dir()  # the rest went; the deep chain is left
    assert sorted(p.name for p in node.container("deep").iterdir()) == ["d0"]


def test_a_planted_temporary_link_cannot_redirect_the_quota_write(node: Node) -> None:
    """`quota.conf.tmp -> <run_dir>/ld.so.preload` made a same-id prepare (a runc-wrapper
    restart) overwrite the node-wide preload file: the quota off for every container."""
    prepare(node, "c1")
    directory = node.container("c1")
    (directory / "quota.conf.tmp").symlink_to(node.run_dir / "ld.so.preload")
    (directory / "usage.shm.tmp").symlink_to(node.run_dir / "ld.so.preload")
    (directory / "usage.shm").unlink()  # so that the region is written again too
    as_unit(lambda: prepare(node, "c1"))
    assert (node.run_dir / "ld.so.preload").read_bytes() == PRELOAD
    assert "vram_limit=1073741824" in (directory / "quota.conf").read_text()
    assert (directory / "usage.shm").read_bytes() == region.empty_region()
    assert not (directory / "quota.conf.tmp").exists()


@pytest.mark.parametrize("damage", ["garbage", "empty", "mode", "link"])
def test_a_damaged_preload_file_is_restored_at_the_next_prepare(
    node: Node, tmp_path: Path, damage: str
) -> None:
    prepare(node, "c1")
    preload = node.run_dir / "ld.so.preload"
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    if damage == "garbage":
        preload.write_bytes(b"/nothing/here.so\n")
    elif damage == "empty":
        preload.write_bytes(b"")
    elif damage == "mode":
        preload.chmod(0o600)  # unreadable for a non-root container: no libhcs there
    else:
        preload.unlink()
        preload.symlink_to(target)
    as_unit(lambda: prepare(node, "c2"))
    assert not preload.is_symlink() and preload.read_bytes() == PRELOAD
    assert stat.S_IMODE(preload.stat().st_mode) == 0o644
    assert target.read_bytes() == b""


def test_the_unit_gives_the_region_to_the_container_and_can_still_read_it(node: Node) -> None:
    """CAP_CHOWN makes the region the container's; 0644 lets hcsd's watchdog (no
    CAP_DAC_READ_SEARCH) read the totals of a region another uid owns."""
    as_unit(lambda: prepare(node, "c1", ContainerUser(1000680000, 0)))
    info = (node.container("c1") / "usage.shm").stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1000680000, 0, 0o644)
    held = Allocation("c1", (Grant(A100_0, GiB),))
    assert as_unit(lambda: AccountedUsage(node.run_dir)(held)) == {A100_0: 0}


def test_without_cap_chown_the_region_is_writable_by_every_uid(node: Node) -> None:
    as_unit(lambda: prepare(node, "c1", ContainerUser(1000, 1000)), without=("CAP_CHOWN",))
    info = (node.container("c1") / "usage.shm").stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o666)


@pytest.mark.parametrize("planted", ["fifo", "link", "directory"])
def test_whatever_stands_at_a_file_name_is_replaced_never_opened(
    node: Node, tmp_path: Path, planted: str
) -> None:
    """A FIFO at `usage.shm` must not hang hcsd (nothing but a regular file is opened), a link
    must not be followed, a directory must not make the write fail."""
    target = tmp_path / "target"
    target.write_bytes(b"untouched")
    directory = node.container("c1")
    directory.mkdir(parents=True)
    for name in ("quota.conf", "usage.shm"):
        if planted == "fifo":
            os.mkfifo(directory / name)
        elif planted == "link":
            (directory / name).symlink_to(target)
        else:
            (directory / name).mkdir()
            (directory / name / "inside").write_text("x")
    as_unit(lambda: prepare(node, "c1"))
    assert (directory / "usage.shm").read_bytes() == region.empty_region()
    assert (directory / "quota.conf").read_text().startswith("# written by hcsd")
    assert target.read_bytes() == b"untouched"


def test_a_removal_looks_at_a_bounded_number_of_entries(tmp_path: Path) -> None:
    """A directory of millions of files (an old-layout container could make them) must not
    stall the event loop in one removal: what is past the budget is left for the next one."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(20):
        (many / f"f{i}").write_text("x")
    with opened_dir(str(tmp_path)) as fd:
        assert remove_tree(fd, "many", budget=8) == ["many: more than 8 entries, left"]
        assert 0 < len(list(many.iterdir())) < 20
        assert remove_tree(fd, "many") == []
    assert not many.exists()


def test_a_stopped_container_started_again_fails_to_mount_its_quota_files(
    node: Node, runtime_binaries: Binaries, tmp_path: Path
) -> None:
    """After the stop, a runtime that starts the same container again (never CRI: kubelet
    makes a new container) fails closed: its quota files are bind-mount sources, gone with
    the directory, and runc refuses a bind mount whose source does not exist."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox for the container's root (Debian's busybox-static)")
    info = ContainerInfo(
        "c-restart", "c", PodRef("ns", "pod", "uid"), container_annotations={"hcs.io/vram": "1Gi"}
    )
    edits = node.injector.create(info)
    assert edits is not None
    quota = [m for m in edits.mounts if m.host_path.startswith(str(node.container("c-restart")))]
    assert len(quota) == 2, edits.mounts  # quota.conf and usage.shm
    bundle = tmp_path / "bundle"
    (bundle / "rootfs/bin").mkdir(parents=True)
    shutil.copy(busybox, bundle / "rootfs/bin/sh")
    runc = [str(runtime_binaries.runc), "--root", str(tmp_path / "runc")]
    subprocess.run([*runc, "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(terminal=False, args=["/bin/sh", "-c", "echo ran"])
    config["mounts"] += [
        {"destination": m.container_path, "type": "bind", "source": m.host_path,
         "options": m.options}
        for m in quota
    ]  # fmt: skip
    (bundle / "config.json").write_text(json.dumps(config))

    def run(name: str) -> subprocess.CompletedProcess[str]:
        command = [*runc, "run", "--bundle", str(bundle), f"hcs-test-{name}-{os.getpid()}"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    first = run("first")
    assert first.returncode == 0 and first.stdout.strip() == "ran", first.stderr
    node.injector.stopped("c-restart")
    again = run("again")
    assert again.returncode != 0 and again.stdout == "", again.stdout
    assert f"stat {quota[0].host_path}: no such file or directory" in again.stderr, again.stderr
