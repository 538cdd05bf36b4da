"""`write_atomic` in a directory someone hostile can write: nothing planted there is followed."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from hcsd.fs import write_atomic
from hcsd.ledger import OsFileSystem


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the directory written to (the node's preload file, the journal)."""
    path = tmp_path / "elsewhere" / "ld.so.preload"
    path.parent.mkdir()
    path.write_bytes(b"/usr/lib/hcs/libhcs.so\n")
    return path


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "container"
    path.mkdir()
    return path


def written(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_a_planted_temp_symlink_is_not_followed(directory: Path, victim: Path) -> None:
    (directory / "quota.conf.tmp").symlink_to(victim)
    write_atomic(OsFileSystem(), str(directory / "quota.conf"), b"vram=1\n")
    assert victim.read_bytes() == b"/usr/lib/hcs/libhcs.so\n"
    assert written(directory) == {"quota.conf": b"vram=1\n"}
    assert not (directory / "quota.conf").is_symlink()


def test_a_symlink_at_the_target_is_replaced_not_followed(directory: Path, victim: Path) -> None:
    (directory / "quota.conf").symlink_to(victim)
    write_atomic(OsFileSystem(), str(directory / "quota.conf"), b"vram=1\n")
    assert victim.read_bytes() == b"/usr/lib/hcs/libhcs.so\n"
    assert written(directory) == {"quota.conf": b"vram=1\n"}


def test_a_symlinked_directory_is_refused(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(victim.parent)
    with pytest.raises(OSError):
        write_atomic(OsFileSystem(), str(link / "ld.so.preload"), b"nothing\n")
    assert victim.read_bytes() == b"/usr/lib/hcs/libhcs.so\n"
    assert sorted(p.name for p in victim.parent.iterdir()) == ["ld.so.preload"]


def test_a_planted_temp_directory_is_left_alone(directory: Path) -> None:
    planted = directory / "quota.conf.tmp"
    planted.mkdir()
    (planted / "inside").write_bytes(b"theirs")
    write_atomic(OsFileSystem(), str(directory / "quota.conf"), b"vram=1\n")
    assert written(directory) == {"quota.conf": b"vram=1\n"}  # no random-named temp left over
    assert (planted / "inside").read_bytes() == b"theirs"


def test_a_planted_temp_fifo_does_not_block(directory: Path) -> None:
    fifo = directory / "quota.conf.tmp"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_atomic(OsFileSystem(), str(directory / "quota.conf"), b"vram=1\n")
        except BaseException as e:
            errors.append(e)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(timeout=5)
    blocked = writer.is_alive()
    if blocked:  # open the other end so the stuck writer (and the test run) can go on
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=5)
    assert not blocked, "write_atomic blocked opening a planted fifo"
    assert errors == []
    assert written(directory) == {"quota.conf": b"vram=1\n"}


def test_a_leftover_temp_file_is_replaced(directory: Path) -> None:
    """A crash between create and rename left `<name>.tmp` behind: it is no obstacle."""
    (directory / "journal.tmp").write_bytes(b"half a snapshot")
    (directory / "journal.tmp").chmod(0o444)
    write_atomic(OsFileSystem(), str(directory / "journal"), b"HCSJ")
    assert written(directory) == {"journal": b"HCSJ"}


@pytest.mark.parametrize("mode", [0o600, 0o644], ids=["0600", "0644"])
def test_mode_is_exact_whatever_the_umask(directory: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(OsFileSystem(), str(directory / "f"), b"x", mode=mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE((directory / "f").stat().st_mode) == mode
