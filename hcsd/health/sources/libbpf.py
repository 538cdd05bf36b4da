"""Loading HCS's CO-RE eBPF objects with the distro's libbpf, through ctypes.

No Python binding of libbpf is needed: the few calls used here are a stable C API (libbpf 1.x).
The ring buffer is consumed from asyncio via its epoll fd, so no thread is started. The
programs are raw tracepoints: attaching one needs neither tracefs nor perf_event_open, only
CAP_BPF and CAP_PERFMON. An optional program whose tracepoint the kernel lacks (attach answers
ENOENT) is left out; the rest still runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["BpfError", "BpfObject", "load_libbpf"]

log = logging.getLogger(__name__)

SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class BpfError(Exception):
    """eBPF cannot be used here (no libbpf, no privileges, no BTF, verifier refusal)."""


@functools.cache
def load_libbpf() -> ctypes.CDLL:
    """The distro's libbpf with the signatures we use declared (once per process)."""
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise BpfError(f"libbpf is not installed ({e}); install the libbpf1 package") from e
    pointer = ctypes.c_void_p
    signatures: dict[str, tuple[object, list[object]]] = {
        "bpf_object__open_file": (pointer, [ctypes.c_char_p, pointer]),
        "bpf_object__load": (ctypes.c_int, [pointer]),
        "bpf_object__close": (None, [pointer]),
        "bpf_object__find_program_by_name": (pointer, [pointer, ctypes.c_char_p]),
        "bpf_object__find_map_by_name": (pointer, [pointer, ctypes.c_char_p]),
        "bpf_program__attach": (pointer, [pointer]),
        "bpf_program__attach_raw_tracepoint": (pointer, [pointer, ctypes.c_char_p]),
        "bpf_link__destroy": (ctypes.c_int, [pointer]),
        "bpf_map__fd": (ctypes.c_int, [pointer]),
        "bpf_map__initial_value": (pointer, [pointer, ctypes.POINTER(ctypes.c_size_t)]),
        "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, pointer, pointer]),
        "libbpf_num_possible_cpus": (ctypes.c_int, []),
        "ring_buffer__new": (pointer, [ctypes.c_int, SAMPLE_FN, pointer, pointer]),
        "ring_buffer__epoll_fd": (ctypes.c_int, [pointer]),
        "ring_buffer__consume": (ctypes.c_int, [pointer]),
        "ring_buffer__free": (None, [pointer]),
    }
    for symbol, (restype, argtypes) in signatures.items():
        try:
            function = getattr(lib, symbol)
        except AttributeError as e:
            raise BpfError(f"libbpf {name} lacks {symbol}: version 1.0 or newer needed") from e
        function.restype = restype
        function.argtypes = argtypes
    return lib


def _error(what: str) -> BpfError:
    code = ctypes.get_errno()
    hint = ""
    if code in (errno.EPERM, errno.EACCES):
        hint = " (needs CAP_BPF and CAP_PERFMON, or root)"
    return BpfError(f"failed to {what}: {os.strerror(code) if code else 'unknown error'}{hint}")


@dataclass
class BpfObject:
    """One loaded .bpf.o with its attached programs and one ring buffer.

    `optional` maps a program to the raw tracepoint it attaches to when that tracepoint may be
    missing from the kernel (not every kernel has AER support).
    """

    path: str
    programs: Iterable[str]
    optional: dict[str, str] = field(default_factory=dict)
    rodata: Callable[[ctypes.c_void_p, int], None] | None = None

    def __post_init__(self) -> None:
        self.lib = load_libbpf()
        self._object: int | None = None
        self._links: list[int] = []
        self._ring: int | None = None
        self._callback: object = None
        self.attached: list[str] = []
        self.disabled: list[str] = []

    def load(self) -> None:
        if not os.path.exists(self.path):
            raise BpfError(f"eBPF object {self.path} is missing (build it with make -C bpf)")
        lib = self.lib
        ctypes.set_errno(0)
        obj = lib.bpf_object__open_file(self.path.encode(), None)
        if not obj:
            raise _error(f"open {self.path}")
        self._object = obj
        for program in self.programs:
            handle = lib.bpf_object__find_program_by_name(obj, program.encode())
            if not handle:
                raise BpfError(f"{self.path} has no program {program}")
        if self.rodata is not None:
            self._apply_rodata()
        ctypes.set_errno(0)
        if lib.bpf_object__load(obj) != 0:
            raise _error(f"load {os.path.basename(self.path)} (verifier log above)")
        for program in self.programs:
            handle = lib.bpf_object__find_program_by_name(obj, program.encode())
            tracepoint = self.optional.get(program)
            ctypes.set_errno(0)
            if tracepoint is None:
                link = lib.bpf_program__attach(handle)
            else:
                link = lib.bpf_program__attach_raw_tracepoint(handle, tracepoint.encode())
            if not link and tracepoint is not None and ctypes.get_errno() == errno.ENOENT:
                self.disabled.append(program)
                log.info("eBPF: kernel has no %s tracepoint; %s disabled", tracepoint, program)
                continue
            if not link:
                raise _error(f"attach {program}")
            self._links.append(link)
            self.attached.append(program)

    def _apply_rodata(self) -> None:
        assert self._object is not None and self.rodata is not None
        name = os.path.basename(self.path).split(".")[0][:8] + ".rodata"
        handle = self.lib.bpf_object__find_map_by_name(self._object, name.encode())
        if not handle:
            raise BpfError(f"{self.path} has no {name} map")
        size = ctypes.c_size_t()
        address = self.lib.bpf_map__initial_value(handle, ctypes.byref(size))
        if not address:
            raise BpfError(f"cannot set {name} of {self.path}")
        self.rodata(ctypes.c_void_p(address), size.value)

    def open_ring(self, on_sample: Callable[[bytes], None], map_name: str = "events") -> int:
        """Create the ring buffer reader; returns its epoll fd for the event loop."""
        assert self._object is not None
        handle = self.lib.bpf_object__find_map_by_name(self._object, map_name.encode())
        if not handle:
            raise BpfError(f"{self.path} has no map {map_name}")

        def sample(_ctx: int, data: int, size: int) -> int:
            try:
                on_sample(ctypes.string_at(data, size))
            except Exception:  # an exception must not unwind through C
                log.exception("eBPF: failed to handle an event")
            return 0

        self._callback = SAMPLE_FN(sample)
        ctypes.set_errno(0)
        ring = self.lib.ring_buffer__new(self.lib.bpf_map__fd(handle), self._callback, None, None)
        if not ring:
            raise _error("create the ring buffer reader")
        self._ring = ring
        fd: int = self.lib.ring_buffer__epoll_fd(ring)
        return fd

    def consume(self) -> int:
        """Hand every pending event to the callback; returns how many."""
        assert self._ring is not None
        count: int = self.lib.ring_buffer__consume(self._ring)
        return count

    def counters(self, map_name: str = "counters", entries: int = 3) -> list[int]:
        """Per-CPU counters summed over CPUs (seen, matched, dropped)."""
        assert self._object is not None
        handle = self.lib.bpf_object__find_map_by_name(self._object, map_name.encode())
        fd = self.lib.bpf_map__fd(handle)
        cpus = self.lib.libbpf_num_possible_cpus()
        values = (ctypes.c_uint64 * cpus)()
        totals = []
        for index in range(entries):
            key = ctypes.c_uint32(index)
            if self.lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values) != 0:
                totals.append(0)
            else:
                totals.append(sum(values))
        return totals

    def close(self) -> None:
        if self._ring is not None:
            self.lib.ring_buffer__free(self._ring)
            self._ring = None
        for link in self._links:
            self.lib.bpf_link__destroy(link)
        self._links.clear()
        if self._object is not None:
            self.lib.bpf_object__close(self._object)
            self._object = None
