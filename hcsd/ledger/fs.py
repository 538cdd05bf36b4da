"""The few file operations the ledger needs, behind a seam so that tests can break them.

`OsFileSystem` is the real thing. Tests pass a subclass that fails a chosen call (ENOSPC on a
write, EIO on fsync) to prove that a failed write changes nothing and loses nothing.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["FileSystem", "OsFileSystem", "write_atomic"]


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

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class OsFileSystem(FileSystem):
    """The real file system."""


def write_atomic(fs: FileSystem, path: str, data: bytes) -> None:
    """Temp file in the same directory → fsync → rename → fsync the directory.

    The last step makes the rename itself durable; without it a crash can bring back the old
    file after we acknowledged the new one.
    """
    directory = os.path.dirname(path) or "."
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        fs.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        fs.remove(temporary)
        raise
    os.close(fd)
    fs.replace(temporary, path)
    fs.sync_dir(directory)
