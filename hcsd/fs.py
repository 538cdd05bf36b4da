"""The few file operations the ledger and hcsd's key files need, behind a seam so that
tests can break them.

`OsFileSystem` is the real thing. Tests pass a subclass that fails a chosen call (ENOSPC on a
write, EIO on fsync) to prove that a failed write changes nothing and loses nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket

__all__ = ["FileSystem", "OsFileSystem", "remove_stale_socket", "write_atomic"]


class FileSystem:
    """Interface and default implementation in one: subclass and override to inject faults."""

    def read(self, path: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def sync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, source: str, target: str, dir_fd: int) -> None:
        """Rename `source` over `target`, both names inside the directory `dir_fd`."""
        os.replace(source, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def sync_dir(self, dir_fd: int) -> None:
        os.fsync(dir_fd)

    def remove(self, name: str, dir_fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


class OsFileSystem(FileSystem):
    """The real file system."""


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(fs: FileSystem, path: str, data: bytes, *, mode: int = 0o600) -> None:
    """Temp file in the same directory → fsync → rename → fsync the directory.

    The last step makes the rename itself durable; without it a crash can bring back the old
    file after we acknowledged the new one.

    The directory may be one a container can write (its quota directory), so nothing here
    follows a name it could have planted: the directory is opened `O_NOFOLLOW`, the temp file
    is created `O_EXCL|O_NOFOLLOW` relative to it (a planted symlink, fifo or directory is never
    opened), and the rename happens inside that same directory fd (a symlink at `path` is
    replaced, not followed). `mode` is set on the descriptor, whatever the umask.
    """
    directory, name = os.path.split(path)
    dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd, temporary = _create_temporary(dir_fd, name)
        try:
            os.fchmod(fd, mode)
            fs.write(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            fs.remove(temporary, dir_fd)
            raise
        os.close(fd)
        try:
            fs.replace(temporary, name, dir_fd)
        except BaseException:
            fs.remove(temporary, dir_fd)
            raise
        fs.sync_dir(dir_fd)
    finally:
        os.close(dir_fd)


def _create_temporary(dir_fd: int, name: str) -> tuple[int, str]:
    """Create `<name>.tmp` afresh; returns its fd and the name it got.

    Something already at `<name>.tmp` is a leftover of a crash, or was planted: it is unlinked
    (which never follows a symlink) and the name created again. One that cannot be unlinked (a
    directory) is left alone, and the temp file gets a random name beside it instead.
    """
    temporary = f"{name}.tmp"
    try:
        return os.open(temporary, _CREATE, 0o600, dir_fd=dir_fd), temporary
    except FileExistsError:
        pass
    try:
        os.unlink(temporary, dir_fd=dir_fd)
        return os.open(temporary, _CREATE, 0o600, dir_fd=dir_fd), temporary
    except (FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError):
        pass
    while True:
        temporary = f"{name}.tmp-{secrets.token_hex(8)}"
        with contextlib.suppress(FileExistsError):
            return os.open(temporary, _CREATE, 0o600, dir_fd=dir_fd), temporary


def remove_stale_socket(path: str) -> bool:
    """Free `path` for a new Unix socket server: True when the socket of an instance that died
    was removed, False when nothing was there. FileExistsError when a process still answers
    on it (binding over a live server's socket would take its clients)."""
    if not os.path.lexists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody answers: left over from a crash
        return True
    finally:
        probe.close()
    raise FileExistsError(path)
