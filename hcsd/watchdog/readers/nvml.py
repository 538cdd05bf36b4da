"""NVIDIA: device memory per process from NVML, the driver's own accounting.

`nvmlDeviceGetComputeRunningProcesses` and `nvmlDeviceGetGraphicsRunningProcesses` list the
processes holding memory on a GPU with `usedGpuMemory` in bytes. Three ABI generations exist
(nvml.h): the unversioned entry points fill `nvmlProcessInfo_v1_t {pid, usedGpuMemory}`; `_v2`
and `_v3` fill the 24-byte `{pid, usedGpuMemory, gpuInstanceId, computeInstanceId}`. The newest
the driver exports is used, each with its own layout. A process in both lists (CUDA and
graphics) is counted once, with the larger figure, as nvidia-smi shows it once ("C+G").

The calls follow NVML's sizing contract: `*infoCount` is the room on the way in and the number
of processes on the way out; too little room answers NVML_ERROR_INSUFFICIENT_SIZE with the
number needed. Buffers are kept between polls and grown on that answer, so a steady node
costs one call per list per GPU.

This talks to the library through ctypes directly rather than pynvml: pynvml's wrappers cover
`_v2`/`_v3` only, build an object per process on every call, and keep one library per Python
process, where the watchdog needs all three layouts, no garbage per poll, and the library the
configuration names. `usedGpuMemory` is "not available" (all ones) on Windows WDDM and for
some MIG configurations: such a process is counted as unmeasured, never as zero.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from hcsd.model import Device, Vendor
from hcsd.watchdog.usage import DeviceTotal, ProcessUsage, ReaderError, Sample, UsageReader

__all__ = ["NvmlReader", "ProcessInfoV1", "ProcessInfoV2"]

log = logging.getLogger(__name__)

SUCCESS, NOT_SUPPORTED, INSUFFICIENT_SIZE, GPU_IS_LOST = 0, 3, 7, 15
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
MAX_ENTRIES = 65536  # a bound on what one GPU's list may ask us to allocate


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: what the unversioned process queries fill (16 bytes)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t, also nvmlProcessInfo_t for `_v3` (24 bytes)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_LISTS = ("Compute", "Graphics")
_VERSIONS: tuple[tuple[str, type[ctypes.Structure]], ...] = (
    ("_v3", ProcessInfoV2),
    ("_v2", ProcessInfoV2),
    ("", ProcessInfoV1),
)


class _Query:
    """One process list of one ABI generation, with its reusable buffer."""

    def __init__(self, function: Any, layout: type[ctypes.Structure]) -> None:
        self.function = function
        self.layout = layout
        self.buffer: Any = (layout * 64)()

    def __call__(self, handle: ctypes.c_void_p) -> list[tuple[int, int]]:
        for _ in range(4):  # processes may start between the sizing answer and the retry
            count = ctypes.c_uint(len(self.buffer))
            code = self.function(handle, ctypes.byref(count), self.buffer)
            if code == SUCCESS:
                n = min(count.value, len(self.buffer))
                return [(self.buffer[i].pid, self.buffer[i].usedGpuMemory) for i in range(n)]
            if code != INSUFFICIENT_SIZE:
                raise _NvmlCode(code)
            size = min(MAX_ENTRIES, max(count.value * 2, len(self.buffer) * 2))
            if size <= len(self.buffer):
                break
            self.buffer = (self.layout * size)()
        raise _NvmlCode(INSUFFICIENT_SIZE)


class _NvmlCode(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class NvmlReader(UsageReader):
    name = "nvml"

    def __init__(self, devices: Sequence[Device], *, library: str) -> None:
        self.uuids = {d.uuid for d in devices if d.vendor is Vendor.NVIDIA}
        self.library = library or "libnvidia-ml.so.1"
        self._lib: Any = None
        self._handles: dict[str, ctypes.c_void_p] = {}
        self._queries: list[_Query] = []
        self.abi = ""  # the generation in use: "v3", "v2" or "v1" (for tests and logs)

    def read(self) -> Sample:
        if self._lib is None:
            self._open()
        sample = Sample()
        for uuid, handle in self._handles.items():
            try:
                self._read_device(uuid, handle, sample)
            except _NvmlCode as e:
                if e.code == GPU_IS_LOST:
                    log.debug("nvml: %s is lost; skipped", uuid)
                else:
                    log.debug("nvml: processes on %s unavailable: %s", uuid, self._error(e.code))
        return sample

    def close(self) -> None:
        if self._lib is not None:
            self._lib.nvmlShutdown()
            self._lib = None
            self._handles.clear()

    def _read_device(self, uuid: str, handle: ctypes.c_void_p, sample: Sample) -> None:
        memory = _Memory()
        if self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == SUCCESS:
            sample.totals.append(DeviceTotal(uuid, int(memory.used)))
        used: dict[int, int] = {}
        for position, query in enumerate(self._queries):
            try:
                listed = query(handle)
            except _NvmlCode as e:
                if e.code == NOT_SUPPORTED and position > 0:
                    continue  # no graphics engine in use or none at all: nothing to list
                raise
            for pid, value in listed:
                if value == NOT_AVAILABLE:
                    sample.unmeasured += 1
                    continue
                used[pid] = max(used.get(pid, 0), int(value))
        sample.processes.extend(ProcessUsage(uuid, pid, value) for pid, value in used.items())
        sample.per_process.add(uuid)

    def _open(self) -> None:
        try:
            lib = ctypes.CDLL(self.library)
        except OSError as e:
            raise ReaderError(f"failed to load NVML ({self.library}): {e}") from e
        lib.nvmlErrorString.restype = ctypes.c_char_p
        self._lib = lib
        code = lib.nvmlInit_v2()
        if code != SUCCESS:
            self._lib = None
            raise ReaderError(f"failed to initialise NVML: {self._error(code, lib)}")
        try:
            self._handles = self._match_handles()
            self._queries = self._pick_queries()
        except ReaderError:
            self.close()
            raise
        missing = self.uuids - set(self._handles)
        if missing:
            log.warning(
                "nvml: GPU(s) %s not found by NVML; not watched", ", ".join(sorted(missing))
            )

    def _match_handles(self) -> dict[str, ctypes.c_void_p]:
        lib, count = self._lib, ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != SUCCESS:
            raise ReaderError("failed to count GPUs through NVML")
        handles = {}
        for index in range(count.value):
            handle, text = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != SUCCESS:
                continue
            if lib.nvmlDeviceGetUUID(handle, text, len(text)) != SUCCESS:
                continue
            uuid = text.value.decode("ascii", "replace")
            if uuid in self.uuids:
                handles[uuid] = handle
        return handles

    def _pick_queries(self) -> list[_Query]:
        """Compute list first (it decides whether a device has per-process figures), then
        graphics; each from the newest ABI generation the library exports."""
        queries = []
        for kind in _LISTS:
            for suffix, layout in _VERSIONS:
                function = getattr(self._lib, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", None)
                if function is not None:
                    queries.append(_Query(function, layout))
                    self.abi = self.abi or suffix.lstrip("_") or "v1"
                    break
        if not queries:
            raise ReaderError("this NVML lists no processes (no *RunningProcesses entry point)")
        return queries

    def _error(self, code: int, lib: Any = None) -> str:
        lib = lib or self._lib
        text = lib.nvmlErrorString(code) if lib is not None else None
        return f"{text.decode() if text else 'error'} ({code})"
