"""A vendor driver's files on a host without that vendor's CDI spec, found the way its own
container runtime finds them, as read-only bind mounts of single files: one search for every
vendor, its lists from the vendor's section (`driver_settings.py`: NVIDIA as
libnvidia-container, Cambricon as its device plugin).

Libraries come from the ld.so cache (`ldcache.py`): each configured name (`libcuda.so` matches
`libcuda.so` and `libcuda.so.*`) for this machine's 64-bit libc6 ABI, the cache's first entry
per name that passes the checks below (the loader takes the first, checked or not). The real
file is mounted under its own name in the container's library directory, and again under the
cache's name (the soname, `libcuda.so.1`) so the loader finds it without the container running
`ldconfig`. Tools come from the binary directories in order; for NVIDIA, the GSP firmware
directory from libcuda's version.

The cache is input hcsd does not trust: a cache name is used only when it is a plain soname (it
becomes a mount destination), and a path only when every component from the driver root to the
file, links included, is root's alone (`trusted_path`), the file is a regular one and a library
lies directly in one of the allowed library directories (a tool in one of the tool directories,
the firmware under /lib/firmware). Anything else is skipped with a warning, and an unreadable
cache mounts no library at all: the container is still created (without the driver, as on a
host without one).
"""

from __future__ import annotations

import logging
import os
import re
import stat

from hcsd.runtime.driver_settings import DriverFiles, NvidiaDriverFiles
from hcsd.runtime.edits import MountEdit
from hcsd.runtime.ldcache import (
    FLAG_ARCH_MASK,
    FLAG_ELF_LIBC6,
    FLAG_TYPE_MASK,
    CacheEntry,
    LdCacheError,
    host_arch_flags,
    read_cache,
)
from hcsd.runtime.trusted_path import UntrustedPath, resolve_trusted

__all__ = ["driver_file_mounts"]

log = logging.getLogger(__name__)

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")
# A cache key becomes a mount destination: a bare file name of soname characters only (no
# "/", "..", control characters or spaces), so a forged cache can neither aim a mount at another
# path nor forge a log line.
_FIRMWARE = ("/lib/firmware/", "/usr/lib/firmware/")  # /lib is a link to usr/lib on merged-/usr
_SONAME = re.compile(r"[A-Za-z0-9+_-][A-Za-z0-9._+-]*")
_cache: dict[tuple[str, tuple[str, ...]], tuple[tuple[int, int, int], list[CacheEntry] | None]] = {}
_found: dict[tuple[str, DriverFiles], tuple[tuple[int, int, int] | None, list[MountEdit]]] = {}


def driver_file_mounts(files: DriverFiles) -> list[MountEdit]:
    """The read-only mounts of the driver's libraries, tools (and NVIDIA's firmware) found on
    the host.

    The search runs on every create, on the event loop, so its answer is kept per settings
    and cache file (its mtime, size and inode: installing or removing a driver runs
    `ldconfig`); a kept answer is used again only after each chosen file passes the checks
    once more, which costs a few `lstat` calls instead of the whole search. A file added
    without a cache change (a tool, the firmware) is seen after the next `ldconfig`."""
    if not files.discover:
        return []
    root = os.path.realpath(files.driver_root)
    key = _stat_key(os.path.join(root, files.ld_cache.lstrip("/")))
    kept = _found.get((root, files))
    fresh = key is not None and kept is not None and kept[0] == key
    if fresh and kept is not None and all(_still_trusted(root, m.host_path) for m in kept[1]):
        return list(kept[1])
    mounts = _search(files, root)
    _found[(root, files)] = (key, mounts)
    return list(mounts)


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _still_trusted(root: str, host_path: str) -> bool:
    """A kept mount's source still resolves to itself through components root's alone."""
    inside = host_path if root == "/" else host_path[len(root) :]
    try:
        resolved, _ = resolve_trusted(root, inside)
    except UntrustedPath:
        return False
    return resolved == inside


def _search(files: DriverFiles, root: str) -> list[MountEdit]:
    mounts: list[MountEdit] = []
    libraries = _libraries(files, root)
    for name, real in libraries.items():
        inside = os.path.join(files.container_library_dir, os.path.basename(real))
        mounts.append(MountEdit(_host(root, real), inside))
        if name != os.path.basename(real):
            mounts.append(
                MountEdit(_host(root, real), os.path.join(files.container_library_dir, name))
            )
    tool_dirs = _allowed(root, files.binary_dirs)
    for binary in files.binaries:
        for directory in files.binary_dirs:
            candidate = os.path.join(directory, binary)
            if not os.path.lexists(_host(root, candidate)):
                continue
            tool = _checked(root, candidate, tool_dirs, files.label)
            if tool is not None:  # a refused candidate does not hide the next directory's
                inside = files.container_binary_dir or directory
                mounts.append(MountEdit(_host(root, tool), os.path.join(inside, binary)))
                break
    if isinstance(files, NvidiaDriverFiles) and files.firmware:
        mounts.extend(_firmware(root, libraries))
    return mounts


def _libraries(files: DriverFiles, root: str) -> dict[str, str]:
    """Cache name -> the real file's path (under the root, without it) of each wanted library."""
    if not files.libraries:  # nothing to look up: the cache is not read
        return {}
    cache = os.path.join(root, files.ld_cache.lstrip("/"))
    entries = _entries(cache, files.libraries, files.label)
    arch = host_arch_flags()
    allowed = _allowed(root, files.library_dirs)
    found: dict[str, str] = {}
    for entry in entries:
        if entry.flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6 or entry.name in found:
            continue
        if arch is not None and entry.flags & FLAG_ARCH_MASK != arch:
            continue
        if not any(entry.name == n or entry.name.startswith(n + ".") for n in files.libraries):
            continue
        if not _SONAME.fullmatch(entry.name):
            log.warning("skipping the ld.so cache entry %r: not a plain library name", entry.name)
            continue
        real = _checked(root, entry.path, allowed, files.label)
        if real is not None:
            found[entry.name] = real
    return found


def _entries(path: str, names: tuple[str, ...], label: str) -> list[CacheEntry]:
    """The cache's entries for `names`, parsed again only when the file changed; none when
    unreadable."""
    try:
        st = os.stat(path)
    except OSError as e:
        log.info("no %s libraries from the ld.so cache: %s", label, e)
        return []
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _cache.get((path, names))
    if cached is None or cached[0] != key:
        try:
            cached = (key, read_cache(path, names))
        except LdCacheError as e:
            log.warning("%s; no %s libraries are mounted", e, label)
            cached = (key, None)
        _cache[(path, names)] = cached
    return cached[1] or []


def _allowed(root: str, directories: tuple[str, ...]) -> frozenset[str]:
    """The directories (inside the root, links resolved) that exist and are root's alone."""
    allowed = set()
    for directory in directories:
        try:
            inside, st = resolve_trusted(root, directory)
        except UntrustedPath:
            continue
        if stat.S_ISDIR(st.st_mode):
            allowed.add(inside)
    return frozenset(allowed)


def _checked(root: str, path: str, allowed: frozenset[str], label: str) -> str | None:
    """`path` resolved inside `root` (returned without the root) if every component on the way
    is root's alone (`trusted_path`) and it is a regular file directly in one of the `allowed`
    directories; None, with a warning, otherwise."""
    why = None
    try:
        inside, st = resolve_trusted(root, path)
    except UntrustedPath as e:
        why = str(e)
    else:
        if os.path.dirname(inside) not in allowed:
            why = f"resolves to {inside}, outside the allowed directories"
        elif not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
    if why is not None:
        log.warning("skipping the %s file %r: %s", label, path, why)
        return None
    return inside


def _firmware(root: str, libraries: dict[str, str]) -> list[MountEdit]:
    """The GSP firmware directory of libcuda's version, as libnvidia-container mounts it."""
    for real in libraries.values():
        name = os.path.basename(real)
        version = name.removeprefix("libcuda.so.")
        if name.startswith("libcuda.so.") and _VERSION.fullmatch(version):
            directory = f"/lib/firmware/nvidia/{version}"
            if not os.path.lexists(_host(root, directory)):
                return []
            try:
                inside, st = resolve_trusted(root, directory)
            except UntrustedPath as e:
                log.warning("skipping the NVIDIA firmware %s: %s", directory, e)
                return []
            if stat.S_ISDIR(st.st_mode) and inside.startswith(_FIRMWARE):
                return [MountEdit(_host(root, inside), directory)]
            log.warning(
                "skipping the NVIDIA firmware %s: not a directory under /lib/firmware", directory
            )
            return []
    return []


def _host(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))
