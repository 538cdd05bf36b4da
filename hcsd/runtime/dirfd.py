"""File operations relative to a directory descriptor, for directories hcsd must not trust.

The per-container directories under `<run_dir>/containers/` hold files that are bind-mounted
into containers; a container may have changed their modes, owners and sizes, and directories
left by an older hcsd (which mounted the whole directory into the container) may hold anything
a container could make: symbolic links, FIFOs, device nodes, sparse files of terabytes,
sub-directories without write permission. So no path is ever joined and followed: each
directory is opened with `O_DIRECTORY|O_NOFOLLOW` relative to its parent's descriptor, each
file relative to its directory's, creation is `O_CREAT|O_EXCL|O_NOFOLLOW`, and nothing but a
directory or a regular file (for reading) is ever opened. hcsd runs without CAP_DAC_OVERRIDE,
so removal restores write permission on directories it owns, and reports instead of raising
what it cannot remove.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Owner", "open_dir", "opened_dir", "read_file", "remove_tree", "write_file"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REOPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # /proc/self/fd, trusted paths
MAX_DEPTH = 32  # deeper trees are reported, not walked (a container could nest without end)
MAX_ENTRIES = 100_000  # entries looked at per removal; the rest waits for the next one


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a new file belongs to (uid, gid)."""

    uid: int
    gid: int


def open_dir(
    name: str, dir_fd: int | None = None, *, create: int | None = None, follow: bool = False
) -> int:
    """A descriptor of directory `name` (relative to `dir_fd`), never through a symbolic link
    unless `follow` (for a configured path such as the run directory, which only root set up);
    made with mode `create` when missing and `create` is given (the mode is set exactly,
    whatever the umask, on a directory this process owns)."""
    flags = _REOPEN_DIRECTORY if follow else _DIRECTORY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        if create is None:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, create, dir_fd=dir_fd)
        fd = os.open(name, flags, dir_fd=dir_fd)
    if create is not None:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != create:
            os.fchmod(fd, create)
    return fd


@contextlib.contextmanager
def opened_dir(
    name: str, dir_fd: int | None = None, *, create: int | None = None, follow: bool = False
) -> Iterator[int]:
    """`open_dir` as a context manager that closes the descriptor."""
    fd = open_dir(name, dir_fd, create=create, follow=follow)
    try:
        yield fd
    finally:
        os.close(fd)


def read_file(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of regular file `name`; None when it is missing or anything but a
    regular file (a FIFO is opened non-blocking and refused, a link not followed)."""
    # The checked inode is reopened through its descriptor's /proc link (which O_NOFOLLOW
    # would refuse): no second lookup of the name, so no race with a swap.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(path_fd).st_mode):
            return None  # never open a device node or FIFO for reading
        fd = os.open(f"/proc/self/fd/{path_fd}", flags)
    except OSError:
        return None
    finally:
        os.close(path_fd)
    try:
        return os.pread(fd, limit, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_file(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int,
    owner: Owner | None = None,
    size: int | None = None,
) -> None:
    """Replace `name` atomically: a new file beside it (`O_EXCL|O_NOFOLLOW`: a link planted at
    the temporary name is removed, never followed) holding `data` (extended with zeros to
    `size` when given, without writing them), its mode and owner set, renamed over `name`.
    Raises OSError (PermissionError for an owner that cannot be set) with nothing left behind.

    No fsync: these files live as long as the containers that mount them, on the run
    directory's tmpfs; a machine crash takes both. The rename alone makes a reader see the old
    file or the new one, whole."""
    temporary = f"{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if size is not None:
            os.ftruncate(fd, size)
        os.fchmod(fd, mode)  # before fchown: the mode of another uid's file takes CAP_FOWNER
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    os.close(fd)
    try:
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError:  # a directory planted at the name: it goes, the file takes its place
        remove_tree(dir_fd, name)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def remove_tree(dir_fd: int, name: str, *, budget: int = MAX_ENTRIES) -> list[str]:
    """Remove `name` (relative to `dir_fd`) and everything under it, whatever a container left
    there; the problems met, each as `path: why` with names escaped (empty: all gone).
    Directories this process owns get their write permission back; anything else that cannot
    go is reported and left, and the rest of the tree is still removed. At most `budget`
    entries are looked at, so that a tree of millions of files cannot stall the caller: the
    rest is reported, for a later call."""
    removal = _Removal(budget)
    removal.remove(dir_fd, name, _printable(name), 0)
    return removal.problems


def _printable(name: str) -> str:
    """A name as a log line may show it: control characters and the like escaped."""
    return name if name.isprintable() else ascii(name)[1:-1]


class _Removal:
    def __init__(self, budget: int) -> None:
        self.problems: list[str] = []
        self.limit = self.budget = budget

    def remove(self, dir_fd: int, name: str, shown: str, depth: int) -> None:
        self.budget -= 1
        try:
            path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self.problems.append(f"{shown}: {e.strerror}")
            return
        try:
            info = os.fstat(path_fd)
            if not stat.S_ISDIR(info.st_mode):
                self.unlink(dir_fd, name, shown, directory=False)
                return
            if depth >= MAX_DEPTH:
                self.problems.append(f"{shown}: nested deeper than {MAX_DEPTH} directories, left")
                return
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                # A container's chmod 0555 must not keep it: the owner may always chmod,
                # through the descriptor's inode (no second lookup of the name).
                with contextlib.suppress(OSError):
                    os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
            if not self.empty(path_fd, shown, depth):
                return
        finally:
            os.close(path_fd)
        self.unlink(dir_fd, name, shown, directory=True)

    def empty(self, path_fd: int, shown: str, depth: int) -> bool:
        """Remove what the directory holds; False when it cannot even be listed."""
        try:
            child_fd = os.open(f"/proc/self/fd/{path_fd}", _REOPEN_DIRECTORY)
        except OSError as e:
            self.problems.append(f"{shown}: {e.strerror}")
            return False
        try:
            with os.scandir(child_fd) as entries:
                for entry in entries:
                    if self.budget <= 0:
                        self.problems.append(f"{shown}: more than {self.limit} entries, left")
                        return False
                    self.remove(
                        child_fd, entry.name, f"{shown}/{_printable(entry.name)}", depth + 1
                    )
        except OSError as e:
            self.problems.append(f"{shown}: {e.strerror}")
            return False
        finally:
            os.close(child_fd)
        return True

    def unlink(self, dir_fd: int, name: str, shown: str, *, directory: bool) -> None:
        try:
            if directory:
                os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self.problems.append(f"{shown}: {e.strerror}")
