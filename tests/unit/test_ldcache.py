"""The ld.so cache parser against caches written by the real ldconfig, and broken ones."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from hcsd.runtime.ldcache import (
    FLAG_ELF_LIBC6,
    NEW_MAGIC,
    LdCacheError,
    host_arch_flags,
    parse_cache,
    read_cache,
)
from tests.harness.fake_driver import LIB_DIR, VERSION, fake_driver, shared_object, update_cache


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return fake_driver(tmp_path / "root", smi=False, firmware=False)


def test_entries_of_a_cache_written_by_ldconfig(cache: Path) -> None:
    entries = {e.name: e for e in read_cache(str(cache))}
    assert set(entries) == {"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"}
    cuda = entries["libcuda.so.1"]
    assert cuda.path == f"/{LIB_DIR}/libcuda.so.1"
    assert cuda.flags & 0xFF == FLAG_ELF_LIBC6
    assert cuda.flags & 0xFF00 == host_arch_flags("x86_64")
    assert (
        cache.parent.parent / LIB_DIR / "libcuda.so.1"
    ).resolve().name == f"libcuda.so.{VERSION}"


def test_many_entries_keep_the_files_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    for n in range(40):
        shared_object(root / "lib" / f"libx{n}.so.1.0", f"libx{n}.so.1", symbol=f"f{n}")
    names = [e.name for e in read_cache(str(update_cache(root, "lib")))]
    assert sorted(names) == sorted(f"libx{n}.so.1" for n in range(40))
    assert len(names) == 40


def _header(nlibs: int, len_strings: int, flags: int = 2) -> bytes:
    return struct.pack("<20sIIB3xI12x", NEW_MAGIC, nlibs, len_strings, flags, 0)


def _one_entry_cache(key: int = 72, value: int = 85) -> bytes:
    strings = b"libcuda.so.1\0/lib/libcuda.so.1\0"
    entry = struct.pack("<iIIIQ", 0x0303, key, value, 0, 0)
    return _header(1, len(strings)) + entry + strings


def test_a_hand_built_cache_and_an_old_format_prefix() -> None:
    new = _one_entry_cache()
    assert [(e.name, e.path) for e in parse_cache(new)] == [("libcuda.so.1", "/lib/libcuda.so.1")]
    old = b"ld.so-1.7.0\0" + struct.pack("<I", 1) + struct.pack("<iII", 3, 0, 0)
    old += b"\0" * ((-len(old)) % 8)
    assert [e.name for e in parse_cache(old + new)] == ["libcuda.so.1"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "truncated header", id="empty"),
        pytest.param(b"not a cache at all, no, not at all, really, no" * 2, "magic", id="magic"),
        pytest.param(_one_entry_cache()[:40], "truncated header", id="short-header"),
        pytest.param(_one_entry_cache()[:60], "entries do not fit", id="short-entries"),
        pytest.param(_one_entry_cache()[:80], "truncated string table", id="short-strings"),
        pytest.param(_one_entry_cache(key=9999), "outside the string table", id="key-outside"),
        pytest.param(_one_entry_cache(key=8), "outside the string table", id="key-in-header"),
        pytest.param(_one_entry_cache(value=60), "outside the string table", id="value-in-entry"),
        pytest.param(_header(10**5, 0), "entries do not fit", id="huge-count"),
        pytest.param(_header(2**20 + 1, 0), "more than 1048576", id="too-many"),
        pytest.param(_header(0, 0, flags=3), "byte order", id="big-endian"),
        pytest.param(b"ld.so-1.7.0\0" + struct.pack("<I", 1000), "old-format", id="old-short"),
    ],
)
def test_corrupt_caches_are_errors(data: bytes, message: str) -> None:
    with pytest.raises(LdCacheError, match=message):
        parse_cache(data)


def test_every_truncation_of_a_real_cache_is_an_error_or_a_prefix(cache: Path) -> None:
    data = cache.read_bytes()
    whole = parse_cache(data)
    for length in range(len(data)):
        try:
            entries = parse_cache(data[:length])
        except LdCacheError:
            continue
        assert entries == whole  # only the trailing extension/padding may be cut


def test_an_unreadable_cache_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(LdCacheError, match=r"failed to read the ld.so cache .*absent"):
        read_cache(str(tmp_path / "absent"))


def _shared_string_cache(nlibs: int, string: bytes) -> bytes:
    """`nlibs` entries whose key and value are all the same string (a forged cache)."""
    at = 48 + 24 * nlibs
    entry = struct.pack("<iIIIQ", FLAG_ELF_LIBC6 | (host_arch_flags() or 0), at, at, 0, 0)
    return _header(nlibs, len(string) + 1) + entry * nlibs + string + b"\0"


def test_a_string_longer_than_path_max_is_an_error() -> None:
    with pytest.raises(LdCacheError, match="longer than 4096"):
        parse_cache(_shared_string_cache(2, b"libcuda.so." + b"1" * 4096))
    assert len(parse_cache(_shared_string_cache(2, b"libcuda.so." + b"1" * 4000))) == 2


def test_many_entries_sharing_one_string_cost_no_more_than_the_file() -> None:
    # About 1 MiB: 40,000 entries naming one 4,000-byte string the driver does not want
    data = _shared_string_cache(40_000, b"libother.so." + b"1" * 4000)
    tracemalloc.start()
    try:
        entries = parse_cache(data, ("libcuda.so",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert entries == [] and peak < 4 << 20
    wanted = _shared_string_cache(40_000, b"libcuda.so." + b"1" * 4000)
    with pytest.raises(LdCacheError, match="more than 4096 entries for the wanted names"):
        parse_cache(wanted, ("libcuda.so",))


def test_unwanted_names_are_compared_as_bytes_and_never_decoded() -> None:
    data = _shared_string_cache(3, b"libother.so.\xff")
    with pytest.raises(LdCacheError, match="not UTF-8"):
        parse_cache(data)
    assert parse_cache(data, ("libcuda.so",)) == []
