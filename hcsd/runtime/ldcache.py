"""Reading glibc's ld.so cache (`/etc/ld.so.cache`), as the dynamic loader and
libnvidia-container do to find the installed driver libraries.

The layout, from glibc's `sysdeps/generic/dl-cache.h` (format "glibc-ld.so.cache" version
"1.1"; written by `ldconfig`, read by `elf/dl-cache.c`): a 48-byte header (magic and version,
20 bytes; the number of entries and the string table's length, u32 each; a flags byte whose low
two bits give the byte order; padding; the extension offset and three unused u32), then the
entries of 24 bytes (flags i32, key and value u32, an unused u32, hwcap u64), then the strings.
Keys (a library's soname or file name) and values (its path) are offsets from the header's
start. Caches before glibc 2.32 may begin with the old "ld.so-1.7.0" table (12-byte entries),
followed by the new header at an 8-byte boundary; only the new part is read.

Everything in the file is checked against its size: a corrupt or truncated cache is an
`LdCacheError`, never a partial answer. The work is bounded as well as the file: at most
MAX_ENTRIES entries, every string offset inside the string table (glibc's own bound), every
string at most PATH_MAX bytes, and with `names` only the wanted entries (at most MAX_WANTED) are
decoded and kept, the names compared as bytes first, so a forged cache of many entries sharing
one long string costs a bounded amount (a few tens of MiB at worst, not gigabytes).
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass

__all__ = ["CacheEntry", "LdCacheError", "host_arch_flags", "parse_cache", "read_cache"]

NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0"
_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext
_ENTRY = struct.Struct("<iIIIQ")
_OLD_ENTRY_SIZE = 12
MAX_SIZE = 64 << 20  # far above any real cache (a few hundred KiB)
MAX_ENTRIES = 1 << 20  # a real cache lists a few thousand
PATH_MAX = 4096
MAX_WANTED = 4096  # matching entries kept with `names`; a real cache has a few dozen

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
# The 64-bit library flags ldconfig sets per machine (dl-cache.h's FLAG_*_LIB64), for the
# little-endian machines this parser reads caches on (s390x, big-endian, is refused earlier).
_ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00, "ppc64le": 0x0500}
_ENDIAN_LITTLE, _ENDIAN_BIG = 2, 3


class LdCacheError(ValueError):
    """The cache cannot be read or is not a cache this parser understands (permanent until
    the host's `ldconfig` rewrites it)."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    name: str  # the key: a soname such as libcuda.so.1, or a file name
    path: str  # where that name is: usually the soname link in a library directory
    flags: int


def host_arch_flags(machine: str | None = None) -> int | None:
    """The arch flags of this machine's native libraries, or None for an unknown machine."""
    return _ARCH_FLAGS.get(machine or os.uname().machine)


def read_cache(path: str, names: tuple[str, ...] | None = None) -> list[CacheEntry]:
    """The entries of the cache file at `path`, in the file's order (the loader's preference);
    with `names`, only those whose name is one of them or starts with one of them and "."."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SIZE + 1)
    except OSError as e:
        raise LdCacheError(f"failed to read the ld.so cache {path}: {e}") from e
    if len(data) > MAX_SIZE:
        raise LdCacheError(f"failed to read the ld.so cache {path}: larger than {MAX_SIZE} bytes")
    try:
        return parse_cache(data, names)
    except LdCacheError as e:
        raise LdCacheError(f"failed to read the ld.so cache {path}: {e}") from e


def parse_cache(data: bytes, names: tuple[str, ...] | None = None) -> list[CacheEntry]:
    """The entries of a cache's bytes (with `names`, the wanted ones as in `read_cache`);
    LdCacheError for anything malformed."""
    start = _new_format_start(data)
    if len(data) < start + _HEADER.size:
        raise LdCacheError("truncated header")
    magic, nlibs, len_strings, flags, _ = _HEADER.unpack_from(data, start)
    if magic != NEW_MAGIC:
        raise LdCacheError(f"not a glibc-ld.so.cache1.1 file (magic {magic[:20]!r})")
    endian = flags & 3
    if endian not in (0, _ENDIAN_LITTLE) or sys.byteorder != "little":
        raise LdCacheError("the cache's byte order is not this machine's")
    if nlibs > MAX_ENTRIES:
        raise LdCacheError(f"{nlibs} entries, more than {MAX_ENTRIES}")
    entries_end = start + _HEADER.size + nlibs * _ENTRY.size
    if entries_end > len(data):
        raise LdCacheError(f"truncated: {nlibs} entries do not fit in {len(data)} bytes")
    if entries_end + len_strings > len(data):
        raise LdCacheError("truncated string table")
    table = (entries_end, entries_end + len_strings)
    wanted = None if names is None else tuple(n.encode() for n in names)
    result: list[CacheEntry] = []
    for index in range(nlibs):
        entry_flags, key, value, _, _ = _ENTRY.unpack_from(
            data, start + _HEADER.size + index * _ENTRY.size
        )
        name = _string(data, start, key, table)
        if wanted is not None and not any(name == n or name.startswith(n + b".") for n in wanted):
            continue
        if wanted is not None and len(result) == MAX_WANTED:
            raise LdCacheError(f"more than {MAX_WANTED} entries for the wanted names")
        path = _string(data, start, value, table)
        result.append(CacheEntry(_decode(name, key), _decode(path, value), entry_flags))
    return result


def _new_format_start(data: bytes) -> int:
    """Where the new-format header begins: 0, or after an old-format table."""
    if not data.startswith(OLD_MAGIC):
        return 0
    if len(data) < 16:
        raise LdCacheError("truncated old-format header")
    old_count: int = struct.unpack_from("<I", data, 12)[0]
    end = 16 + old_count * _OLD_ENTRY_SIZE
    if end > len(data):
        raise LdCacheError("truncated old-format table")
    return (end + 7) & ~7


def _string(data: bytes, base: int, offset: int, table: tuple[int, int]) -> bytes:
    """The NUL-terminated string at `base + offset`, which must begin in the string table and
    end (within PATH_MAX bytes) before its end."""
    begin = base + offset
    if not table[0] <= begin < table[1]:
        raise LdCacheError(f"string offset {offset} outside the string table")
    end = data.find(b"\0", begin, min(table[1], begin + PATH_MAX + 1))
    if end < 0:
        raise LdCacheError(f"string at offset {offset} unterminated or longer than {PATH_MAX}")
    return data[begin:end]


def _decode(raw: bytes, offset: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise LdCacheError(f"string at offset {offset} is not UTF-8") from e
