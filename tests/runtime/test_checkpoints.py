"""Checkpoint resume on real directories: which checkpoint is the newest complete one, and what
a tenant who fills the directory can (not) make hcsd do.

The directory is the host side of a pod's volume: names, links, FIFOs, sizes and counts are the
tenant's. hcsd must never follow a link out of it, never open anything but a small pointer
file, stay bounded, and never fail the container's creation because of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from hcsd.contract.assignment import sign
from hcsd.discovery import Inventory
from hcsd.model import FrontEnd, NodeMode, PodRef
from hcsd.runtime.checkpoints import CheckpointError, CheckpointSection, newest_complete
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.dirfd import opened_dir
from hcsd.runtime.edits import ContainerEdits
from hcsd.runtime.injector import ContainerInfo
from hcsd.runtime.resume import ENV, STATUS_ENV, Found, Resumes, newest_in
from tests.capabilities import as_unit
from tests.harness.local import local_node

DEFAULTS = CheckpointSection()
LABEL = "team-a/trainer/main"
POD = PodRef("team-a", "trainer", "pod-uid-1")
A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"


def checkpoint(directory: Path, name: str, *, complete: bool = True) -> Path:
    path = directory / name
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(b"weights")
    if complete:
        (path / "COMPLETE").write_text("")
    return path


def newest(directory: Path, settings: CheckpointSection = DEFAULTS) -> str | None:
    with opened_dir(str(directory)) as fd:
        name, _ = newest_complete(fd, settings)
    return name


def resume(
    source: Path,
    path: str = "/ckpt",
    *,
    destination: str = "/ckpt",
    settings: CheckpointSection = DEFAULTS,
    pod: dict[str, str] | None = None,
) -> dict[str, str]:
    """The env the resume edits give a container whose mount `destination` is `source`."""
    annotations = {"hcs.io/checkpoint-path": path} if pod is None else pod
    resumes = Resumes(settings)
    mounts = [ContainerMount(destination, str(source))]
    found = asyncio.run(resumes.look(LABEL, {}, annotations, mounts))
    assert resumes.join(5)
    if found is None:
        return {}
    edits = found.edits
    assert not (edits.devices or edits.mounts or edits.annotations)
    return dict(edits.env)


def found(path: str) -> dict[str, str]:
    return {ENV: path, STATUS_ENV: "found"}


NONE = {STATUS_ENV: "none"}  # the scan ended: nothing complete there
UNKNOWN = {STATUS_ENV: "unknown"}  # hcsd could not tell


def test_the_newest_complete_checkpoint_wins_and_an_incomplete_one_is_ignored(
    tmp_path: Path,
) -> None:
    for step in (1, 2):
        checkpoint(tmp_path, f"step-{step}")
    checkpoint(tmp_path, "step-3", complete=False)  # being written when the node failed
    assert newest(tmp_path) == "step-2"
    assert resume(tmp_path) == found("/ckpt/step-2")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(["step-9", "step-10"], "step-10", id="step-10-after-step-9"),
        pytest.param(["global_step99", "global_step100"], "global_step100", id="deepspeed-tags"),
        pytest.param(["checkpoint-500", "checkpoint-1000"], "checkpoint-1000", id="hf-trainer"),
        pytest.param(["step-2-of-3", "step-10-of-3", "step-10-of-2"], "step-10-of-3", id="tuple"),
        pytest.param(["step-0007", "step-8"], "step-8", id="leading-zeros"),
    ],
)
def test_checkpoints_are_ordered_by_the_numbers_in_their_names(
    tmp_path: Path, names: list[str], expected: str
) -> None:
    for name in names:
        checkpoint(tmp_path, name)
    # mtimes say the opposite: a copy or a restore changes them, the names do not
    for age, name in enumerate(reversed(sorted(names))):
        os.utime(tmp_path / name, (1_000_000 + age, 1_000_000 + age))
    assert newest(tmp_path) == expected


def test_what_does_not_match_or_holds_no_number_is_not_a_checkpoint(tmp_path: Path) -> None:
    checkpoint(tmp_path, "step-latest")  # no number
    checkpoint(tmp_path, "backup-99")  # no pattern
    (tmp_path / "step-50").write_text("a file, not a directory")
    assert newest(tmp_path) is None
    assert resume(tmp_path) == NONE


def test_an_unprintable_name_is_not_a_checkpoint(tmp_path: Path) -> None:
    """It would end up in the container's environment and in the log: a newline there forges
    a variable or a line."""
    checkpoint(tmp_path, "step-1")
    checkpoint(tmp_path, "step-9\nFOO=bar")
    assert newest(tmp_path) == "step-1"
    assert resume(tmp_path) == found("/ckpt/step-1")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("step-3-" + "-".join(["1"] * 8), id="nine-numbers"),
        pytest.param("step-" + "9" * 21, id="twenty-one-digits"),
    ],
)
def test_a_name_with_too_many_numbers_is_not_a_checkpoint(tmp_path: Path, name: str) -> None:
    checkpoint(tmp_path, "step-2")
    checkpoint(tmp_path, name)
    assert newest(tmp_path) == "step-2"
    longest = "step-" + "-".join(["9" * 20] * 8)  # the most a name may hold, and the largest
    checkpoint(tmp_path, longest)
    assert newest(tmp_path) == longest


def test_names_made_to_be_slow_to_compare_cost_little(tmp_path: Path) -> None:
    """A tenant's 9,999 directories of 124 numbers each, none complete: each name is dropped
    at its ninth number, and the newest are picked with a heap, not a sort of all. Without
    these bounds the scan took 0.36 s of CPU on an idle core (well over a second under load,
    past `timeout`); with them 0.06 s. CPU time of this thread, not wall time: the machine's
    load does not count."""
    for number in range(9_999):
        (tmp_path / ("step-" + "9-" * 123 + f"{number:04d}")).mkdir()
    started = time.thread_time()
    assert newest(tmp_path) is None
    assert time.thread_time() - started < 0.15


def test_torch_distributed_checkpoint_metadata_marks_completion(tmp_path: Path) -> None:
    (tmp_path / "step-4").mkdir()
    (tmp_path / "step-4" / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / "step-4" / ".metadata").write_bytes(b"pickle")
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / ".metadata.tmp").write_bytes(b"being renamed")
    assert newest(tmp_path) == "step-4"


def test_the_matcher_is_configurable(tmp_path: Path) -> None:
    (tmp_path / "iter_0000200").mkdir()
    (tmp_path / "iter_0000200" / "DONE").write_text("")
    checkpoint(tmp_path, "step-900")
    settings = CheckpointSection(directories=("iter_*",), markers=("DONE",), pointers=())
    assert newest(tmp_path, settings) == "iter_0000200"
    with pytest.raises(ValueError, match="markers: expected a list of file names"):
        CheckpointSection(markers=("../COMPLETE",))


def test_a_latest_pointer_names_the_checkpoint(tmp_path: Path) -> None:
    """DeepSpeed writes `latest` with the tag when the save is done; its tag directories have
    no marker. A valid pointer wins over the scan."""
    (tmp_path / "global_step7").mkdir()
    checkpoint(tmp_path, "step-9")
    (tmp_path / "latest").write_text("global_step7\n")
    assert resume(tmp_path) == found("/ckpt/global_step7")
    (tmp_path / "latest").write_text("epoch=3-step=400.ckpt")  # a file checkpoint
    (tmp_path / "epoch=3-step=400.ckpt").write_bytes(b"weights")
    assert resume(tmp_path) == found("/ckpt/epoch=3-step=400.ckpt")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b"../outside", "is not one name in its directory", id="parent"),
        pytest.param(b"/etc", "is not one name in its directory", id="absolute"),
        pytest.param(b"sub/step-1", "is not one name in its directory", id="nested"),
        pytest.param(b"..", "is not one name in its directory", id="dotdot"),
        pytest.param(b"step-1\nforged", "is not one name in its directory", id="newline"),
        pytest.param(b"missing", "No such file or directory", id="missing"),
        pytest.param(b"escape", "is not a directory or a file", id="names-a-link"),
        pytest.param(b"\xff\xfe", "not UTF-8 text", id="binary"),
        pytest.param(b"x" * 5000, "larger than 4096 bytes", id="huge"),
    ],
)
def test_a_bad_pointer_is_ignored_logged_and_the_scan_decides(
    tmp_path: Path, content: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    checkpoint(outside, "step-99")
    ckpt = tmp_path / "ckpt"
    checkpoint(ckpt, "step-1")
    (ckpt / "escape").symlink_to(outside / "step-99")
    (ckpt / "latest").write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert resume(ckpt) == found("/ckpt/step-1")
    assert f"{LABEL}: checkpoints in /ckpt: pointer latest:" in caplog.text
    assert why in caplog.text
    assert "\nforged" not in caplog.text  # tenant text escaped in the log


def test_links_out_of_the_directory_are_never_followed(tmp_path: Path) -> None:
    """Every way a tenant could point hcsd at another directory: a checkpoint directory that
    is a link, a marker that is a link, a pointer file that is a link, a link on the way from
    the mount to the annotated path. hcsd sees the host as root: none may count."""
    outside = tmp_path / "outside"
    checkpoint(outside, "step-99")
    (outside / "latest").write_text("step-60")  # exists in ckpt: followed, it would win
    (outside / "marker").write_text("")
    source = tmp_path / "volume"
    ckpt = source / "run"
    checkpoint(ckpt, "step-1")
    (ckpt / "step-50").symlink_to(outside / "step-99")  # a complete checkpoint elsewhere
    (ckpt / "step-60").mkdir()
    (ckpt / "step-60" / "COMPLETE").symlink_to(outside / "marker")  # a marker elsewhere
    (ckpt / "latest").symlink_to(outside / "latest")  # a pointer elsewhere
    assert resume(source, "/ckpt/run") == found("/ckpt/run/step-1")
    (source / "elsewhere").symlink_to(outside)
    assert resume(source, "/ckpt/elsewhere") == UNKNOWN


def test_a_link_on_the_way_is_logged_and_nothing_is_injected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    checkpoint(outside, "step-99")
    source = tmp_path / "volume"
    source.mkdir()
    (source / "run").symlink_to(outside)
    with caplog.at_level(logging.WARNING):
        assert resume(source, "/ckpt/run") == UNKNOWN
    assert f"{LABEL}: no checkpoint resume: failed to read its directory:" in caplog.text


def test_a_link_in_the_mount_source_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet's path to the volume is read as it is, never wherever a link in it points
    now: hcsd cannot tell, and does not guess (the container starts with `unknown`)."""
    volume = tmp_path / "volume"
    checkpoint(volume, "step-1")
    (tmp_path / "link").symlink_to(volume)
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path / "link") == UNKNOWN
    assert (
        f"{LABEL}: no checkpoint resume: failed to open the mount source "
        f"'{tmp_path}/link': 'link' in it is a symbolic link, not followed"
    ) in caplog.text
    assert resume(volume) == found("/ckpt/step-1")


def test_fifos_and_devices_are_never_opened(tmp_path: Path) -> None:
    """A FIFO as the pointer or the marker would block an open for reading: neither counts
    (and the scan returns at once)."""
    checkpoint(tmp_path, "step-1")
    (tmp_path / "step-2").mkdir()
    os.mkfifo(tmp_path / "step-2" / "COMPLETE")
    os.mkfifo(tmp_path / "latest")
    started = time.monotonic()
    assert resume(tmp_path) == found("/ckpt/step-1")
    assert time.monotonic() - started < 0.4


def test_a_huge_directory_is_not_judged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for step in range(120):
        (tmp_path / f"step-{step}").mkdir()
    (tmp_path / "step-119" / "COMPLETE").write_text("")
    settings = CheckpointSection(max_entries=100)
    with opened_dir(str(tmp_path)) as fd, pytest.raises(CheckpointError, match="more than 100"):
        newest_complete(fd, settings)
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, settings=settings) == UNKNOWN
    assert "more than 100 entries (runtime.checkpoints.max_entries)" in caplog.text
    assert resume(tmp_path) == found("/ckpt/step-119")  # under the default bound


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("ckpt", id="relative"),
        pytest.param("/ckpt/../etc", id="dotdot"),
        pytest.param("/ckpt/", id="trailing-slash"),
        pytest.param("/ckpt//run", id="double-slash"),
        pytest.param("/ckpt\nforged line", id="newline"),
        pytest.param("/" + "a" * 2000, id="too-long"),
    ],
)
def test_a_malformed_annotation_starts_the_container_without_resume(
    tmp_path: Path, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint(tmp_path, "step-1")
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, path) == UNKNOWN
    assert f"{LABEL}: no checkpoint resume: hcs.io/checkpoint-path: " in caplog.text
    assert "\nforged" not in caplog.text


def test_a_path_outside_every_mount_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint(tmp_path, "step-1")
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, "/ckptx") == UNKNOWN
    assert "'/ckptx' is in none of the container's mounts" in caplog.text


def test_no_annotation_or_no_directory_yet_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, pod={}) == {}
        assert resume(tmp_path, "/ckpt/run-1") == NONE  # the first run makes it
        assert resume(tmp_path, settings=CheckpointSection(enabled=False)) == {}
    assert caplog.text == ""


def test_a_missing_mount_source_is_unknown_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The runtime mounts the source into the container, so it exists; if hcsd does not see
    it, its view differs (the unit's PrivateTmp hides /tmp and /var/tmp): not "no checkpoint"."""
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path / "gone") == UNKNOWN
    assert f"{LABEL}: no checkpoint resume: failed to open the mount source" in caplog.text
    assert "PrivateTmp" in caplog.text


def _as_unit_resume(source: str) -> dict[str, str]:
    return resume(Path(source))


def test_under_the_units_capabilities(tmp_path: Path) -> None:
    """hcsd's unit has no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH: a directory a non-root
    container user wrote with the usual 0755 is read; one it closed (0700) is not, and the
    container starts without resume (docs/runtime.md says so)."""
    source = tmp_path / "volume"
    checkpoint(source, "step-3")
    for path in (source, source / "step-3", source / "step-3" / "COMPLETE"):
        os.chown(path, 1000, 1000)
    tmp_path.chmod(0o755)
    assert as_unit(lambda: _as_unit_resume(str(source))) == found("/ckpt/step-3")
    source.chmod(0o700)
    assert as_unit(lambda: _as_unit_resume(str(source))) == UNKNOWN


class Recording:
    """The real scan, each call recorded: the mount sources hcsd looked into."""

    def __init__(self) -> None:
        self.sources: list[str] = []

    def __call__(
        self, source: str, below: str, shadowed: Collection[str], settings: CheckpointSection
    ) -> Found:
        self.sources.append(source)
        return newest_in(source, below, shadowed, settings)


async def test_the_injector_adds_it_only_for_containers_that_hold_devices(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    """The read is root's, in a tenant's directory: only a container hcsd serves (here a
    local request; in cluster mode a verified assignment) makes hcsd do it."""
    volume = tmp_path / "volume"
    checkpoint(volume, "step-1")
    checkpoint(volume, "step-2")
    checkpoint(volume, "step-3", complete=False)
    node = local_node(tmp_path / "node", mixed_inventory)
    injector = node.injector()
    scans = Recording()
    injector.resumes = Resumes(DEFAULTS, scan=scans)
    pod = {"hcs.io/checkpoint-path": "/ckpt"}
    mounts = (ContainerMount("/ckpt", str(volume)), ContainerMount("/etc/hosts", "/etc/hosts"))

    async def create(cid: str, annotations: dict[str, str]) -> ContainerEdits | None:
        info = ContainerInfo(cid, "main", POD, annotations, pod, FrontEnd.NRI, mounts=mounts)
        return injector.create(info, await injector.resume(info))

    edits = await create("c1", {"hcs.io/vram": "1Gi"})
    assert edits is not None and dict(edits.env)[ENV] == "/ckpt/step-2"
    assert dict(edits.env)[STATUS_ENV] == "found"
    assert dict(edits.env)["HCS_CONFIG"] == "/run/hcs/quota.conf"  # the rest as before
    assert scans.sources == [str(volume)]
    assert await create("c2", {}) is None
    assert scans.sources == [str(volume)]  # asks for no device: hcsd did not look
    node.close()


async def test_an_assigned_container_gets_it_and_the_pods_sidecar_does_not(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    """On a cluster node: the container the verified assignment gives a device resumes; the
    pod's other container (the assignment gives it nothing) is not looked at."""
    now = 1_760_000_000.0
    key = b"test-cluster-key-0123456789abcdef"
    volume = tmp_path / "volume"
    checkpoint(volume, "global_step7")
    (volume / "latest").write_text("global_step7")
    node = local_node(tmp_path / "node", mixed_inventory, clock=lambda: now)
    injector = node.injector(assignment_key=key, mode=NodeMode.CLUSTER, clock=lambda: now)
    scans = Recording()
    injector.resumes = Resumes(DEFAULTS, scan=scans)
    body = {
        "v": 1,
        "node": "sim",
        "pod_uid": POD.uid,
        "issued": now - 60,
        "containers": {"main": [{"uuid": A100_0, "vram": 2**30, "compute": 25}]},
    }
    pod = {"hcs.io/assignment": sign(body, key), "hcs.io/checkpoint-path": "/ckpt"}
    mounts = (ContainerMount("/ckpt", str(volume)),)

    async def create(cid: str, name: str) -> ContainerEdits | None:
        info = ContainerInfo(cid, name, POD, {}, pod, FrontEnd.NRI, mounts=mounts)
        return injector.create(info, await injector.resume(info))

    edits = await create("c1", "main")
    assert edits is not None and dict(edits.env)[ENV] == "/ckpt/global_step7"
    assert await create("c2", "sidecar") is None
    assert scans.sources == [str(volume)]  # the sidecar's creation did not look
    node.close()


def test_only_the_newest_directories_are_looked_into(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Thousands of unfinished directories above the one complete checkpoint: each would be
    an open and a stat as root; past `max_checked` the older ones are not looked at."""
    checkpoint(tmp_path, "step-0")
    for number in range(1, 31):
        (tmp_path / f"step-{number}").mkdir()
    assert resume(tmp_path, settings=CheckpointSection(max_checked=31)) == found("/ckpt/step-0")
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, settings=CheckpointSection(max_checked=30)) == NONE
    assert "none of the newest 30 checkpoint directories is complete" in caplog.text


@pytest.mark.parametrize(
    ("key", "value", "accepts"),
    [
        pytest.param("timeout", 1.5, "a number of seconds in (0, 1]", id="timeout"),
        pytest.param("timeout", 0, "a number of seconds in (0, 1]", id="no-timeout"),
        pytest.param(
            "max_pointer_bytes", 65_537, "a positive integer up to 65,536", id="pointer-bytes"
        ),
        pytest.param("max_entries", 1_000_001, "a positive integer up to 1,000,000", id="entries"),
        pytest.param("max_checked", 10_001, "a positive integer up to 10,000", id="checked"),
    ],
)
def test_settings_past_their_bounds_are_refused(key: str, value: Any, accepts: str) -> None:
    """Past these a scan is no longer a few milliseconds, or the runtime's own 2 s wait for
    the whole creation runs out first."""
    with pytest.raises(ValueError, match=rf"{key}: expected {re.escape(accepts)}"):
        CheckpointSection(**{key: value})
    CheckpointSection(timeout=1, max_pointer_bytes=65_536, max_entries=10**6, max_checked=10**4)
