"""The NVIDIA driver's files on a host without a vendor CDI spec, found the way
libnvidia-container finds them, as read-only bind mounts of single files.

Libraries come from the ld.so cache (`ldcache.py`): each configured name (`libcuda.so` matches
`libcuda.so` and `libcuda.so.*`) for this machine's 64-bit libc6 ABI, the cache's first entry
per name (the loader's choice). The real file is mounted under its own name in the container's
library directory, and again under the cache's name (the soname, `libcuda.so.1`) so the loader
finds it without the container running `ldconfig`. Tools come from the binary directories in
order, the GSP firmware directory from libcuda's version.

The cache is input hcsd does not trust: a path is used only when, with every link resolved
under the driver root, it is a regular file owned by root that no group or other user may write,
and a library only when it lies directly in one of the allowed library directories. Anything
else is skipped with a warning, and an unreadable cache mounts no library at all: the container
is still created (without the driver, as on a host without one).
"""

from __future__ import annotations

import logging
import os
import re
import stat

from hcsd.runtime.driver_settings import NvidiaDriverFiles
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

__all__ = ["nvidia_driver_mounts"]

log = logging.getLogger(__name__)

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")
# A cache key becomes a mount destination: a bare file name of soname characters only (no
# "/", "..", control characters or spaces), so a forged cache can neither aim a mount at another
# path nor forge a log line.
_SONAME = re.compile(r"[A-Za-z0-9+_-][A-Za-z0-9._+-]*")
_cache: dict[str, tuple[tuple[int, int, int], list[CacheEntry] | None]] = {}


def nvidia_driver_mounts(files: NvidiaDriverFiles) -> list[MountEdit]:
    """The read-only mounts of the driver's libraries, tools and firmware found on the host."""
    if not files.discover:
        return []
    root = os.path.realpath(files.driver_root)
    mounts: list[MountEdit] = []
    libraries = _libraries(files, root)
    for name, real in libraries.items():
        inside = os.path.join(files.container_library_dir, os.path.basename(real))
        mounts.append(MountEdit(_host(root, real), inside))
        if name != os.path.basename(real):
            mounts.append(
                MountEdit(_host(root, real), os.path.join(files.container_library_dir, name))
            )
    for binary in files.binaries:
        for directory in files.binary_dirs:
            candidate = os.path.join(directory, binary)
            if not os.path.lexists(_host(root, candidate)):
                continue
            tool = _checked(root, candidate, files.binary_dirs)
            if tool is not None:
                mounts.append(MountEdit(_host(root, tool), os.path.join("/usr/bin", binary)))
            break
    if files.firmware:
        mounts.extend(_firmware(root, libraries))
    return mounts


def _libraries(files: NvidiaDriverFiles, root: str) -> dict[str, str]:
    """Cache name -> the real file's path (under the root, without it) of each wanted library."""
    entries = _entries(os.path.join(root, files.ld_cache.lstrip("/")))
    arch = host_arch_flags()
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
        real = _checked(root, entry.path, files.library_dirs)
        if real is not None:
            found[entry.name] = real
    return found


def _entries(path: str) -> list[CacheEntry]:
    """The cache's entries, parsed again only when the file changed; none when unreadable."""
    try:
        st = os.stat(path)
    except OSError as e:
        log.info("no NVIDIA driver libraries from the ld.so cache: %s", e)
        return []
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _cache.get(path)
    if cached is None or cached[0] != key:
        try:
            cached = (key, read_cache(path))
        except LdCacheError as e:
            log.warning("%s; no NVIDIA driver libraries are mounted", e)
            cached = (key, None)
        _cache[path] = cached
    return cached[1] or []


def _checked(root: str, path: str, directories: tuple[str, ...]) -> str | None:
    """`path` with its links resolved inside `root` (returned without the root) if it is a
    root-owned regular file, not writable by group or others, directly in one of
    `directories` (themselves resolved); None, with a warning, otherwise."""
    real = os.path.realpath(_host(root, path))
    inside = _strip(root, real)
    allowed = {_strip(root, os.path.realpath(_host(root, d))) for d in directories}
    why = None
    if inside is None:
        why = "resolves outside the driver root"
    elif os.path.dirname(inside) not in allowed:
        why = f"resolves to {inside}, outside the allowed directories"
    else:
        try:
            st = os.lstat(real)
        except OSError as e:
            why = str(e)
        else:
            if not stat.S_ISREG(st.st_mode):
                why = "is not a regular file"
            elif st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                why = "is not owned by root, or is writable by others"
    if why is not None:
        log.warning("skipping the NVIDIA driver file %r: it %s", path, why)
        return None
    return inside


def _firmware(root: str, libraries: dict[str, str]) -> list[MountEdit]:
    """The GSP firmware directory of libcuda's version, as libnvidia-container mounts it."""
    for real in libraries.values():
        name = os.path.basename(real)
        version = name.removeprefix("libcuda.so.")
        if name.startswith("libcuda.so.") and _VERSION.fullmatch(version):
            directory = f"/lib/firmware/nvidia/{version}"
            host = os.path.realpath(_host(root, directory))
            try:
                st = os.lstat(host)
            except OSError:
                return []
            safe = st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if stat.S_ISDIR(st.st_mode) and safe and _strip(root, host) is not None:
                return [MountEdit(host, directory)]
            log.warning("skipping the NVIDIA firmware %s: not a root-owned directory", directory)
            return []
    return []


def _host(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _strip(root: str, real: str) -> str | None:
    """`real` as a path inside `root` ("/..."), or None when it is not under it."""
    if root == "/":
        return real
    if real == root or real.startswith(root + "/"):
        return real[len(root) :] or "/"
    return None
