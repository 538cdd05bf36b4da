"""Which host directory a path in a container is: the mount the container sees there, the
names mounts below it cover, and a source opened without following a link."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from hcsd.runtime.checkpoints import CheckpointSection
from hcsd.runtime.container_mounts import (
    ContainerMount,
    Located,
    MountError,
    locate,
    open_source,
)
from hcsd.runtime.resume import ENV, STATUS_ENV, Resumes

LABEL = "team-a/trainer/main"


def bind(destination: str, source: str) -> ContainerMount:
    return ContainerMount(destination, source)


def tmpfs(destination: str) -> ContainerMount:
    return ContainerMount(destination, "tmpfs", bind=False, kind="tmpfs")


def test_the_deepest_mount_holding_the_path_is_used() -> None:
    mounts = [
        bind("/data", "/host/data"),
        bind("/data/ckpt", "/host/ckpt"),
        bind("/datax", "/host/datax"),
        bind("/etc/hosts", "/host/hosts"),
    ]
    assert locate("/data/ckpt/run", mounts) == Located(mounts[1], "run", frozenset())
    assert locate("/data/ckpt", mounts) == Located(mounts[1], "", frozenset())
    assert locate("/data/other", mounts) == Located(mounts[0], "other", frozenset())
    assert locate("/datax", mounts) == Located(mounts[2], "", frozenset())
    with pytest.raises(MountError, match="'/dat' is in none of the container's mounts"):
        locate("/dat", mounts)
    root = bind("/", "/host/root")
    assert locate("/run", [root]) == Located(root, "run", frozenset())


@pytest.mark.parametrize(
    "mounts",
    [
        pytest.param([bind("/ckpt", "/host/ckpt"), tmpfs("/ckpt")], id="tmpfs-over-it"),
        pytest.param([bind("/data", "/host/data"), tmpfs("/data/ckpt")], id="tmpfs-at-it"),
        pytest.param([tmpfs("/data")], id="tmpfs-above-it"),
    ],
)
def test_a_mount_other_than_a_bind_holding_the_path_means_no_host_directory(
    mounts: list[ContainerMount],
) -> None:
    with pytest.raises(MountError, match="is on a tmpfs mount at"):
        locate("/data/ckpt" if mounts[0].destination == "/data" else "/ckpt", mounts)


def test_mounts_below_the_path_cover_names() -> None:
    mounts = [
        bind("/ckpt", "/host/ckpt"),
        tmpfs("/ckpt/step-5"),
        bind("/ckpt/step-7/COMPLETE", "/host/marker"),
        bind("/ckpt/latest", "/host/latest"),
        bind("/ckptx/step-9", "/host/x"),
    ]
    assert locate("/ckpt", mounts).shadowed == {"step-5", "step-7", "latest"}
    assert locate("/", [bind("/", "/host"), tmpfs("/step-1")]).shadowed == {"step-1"}


def resume(source: Path, mounts: list[ContainerMount]) -> dict[str, str]:
    resumes = Resumes(CheckpointSection())
    found = asyncio.run(resumes.look(LABEL, {}, {"hcs.io/checkpoint-path": "/ckpt"}, mounts))
    assert found is not None and resumes.join(5)
    return dict(found.edits.env)


def complete(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "COMPLETE").write_text("")


def test_what_the_container_does_not_see_is_never_the_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """step-3 and the `latest` pointer on the host are covered in the container by other
    mounts: resuming from them would resume from what the container cannot read."""
    for step in (2, 3):
        complete(tmp_path / f"step-{step}")
    (tmp_path / "latest").write_text("step-3")
    volume = [bind("/ckpt", str(tmp_path))]
    assert resume(tmp_path, volume) == {ENV: "/ckpt/step-3", STATUS_ENV: "found"}
    covered = [*volume, tmpfs("/ckpt/step-3"), bind("/ckpt/latest", str(tmp_path / "x"))]
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, covered) == {ENV: "/ckpt/step-2", STATUS_ENV: "found"}
    assert "pointer latest: a mount in the container covers it, ignored" in caplog.text
    pointer_covered = [*volume, tmpfs("/ckpt/step-3")]
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path, pointer_covered) == {ENV: "/ckpt/step-2", STATUS_ENV: "found"}
    assert "'step-3' is covered by a mount in the container, ignored" in caplog.text


def test_a_tmpfs_over_the_path_is_unknown_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    complete(tmp_path / "step-1")
    with caplog.at_level(logging.WARNING):
        mounts = [bind("/ckpt", str(tmp_path)), tmpfs("/ckpt")]
        assert resume(tmp_path, mounts) == {STATUS_ENV: "unknown"}
    assert f"{LABEL}: no checkpoint resume: hcs.io/checkpoint-path '/ckpt' is on a tmpfs" in (
        caplog.text
    )


def test_the_source_is_opened_without_following_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    fd = open_source(str(tmp_path / "real"))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "real"))
    finally:
        os.close(fd)
    with pytest.raises(MountError, match="'link' in it is a symbolic link, not followed"):
        open_source(str(tmp_path / "link" / "below"))
    with pytest.raises(FileNotFoundError):
        open_source(str(tmp_path / "missing"))
    with pytest.raises(MountError, match="not an absolute path in normal form"):
        open_source(str(tmp_path / "real" / ".." / "real"))
