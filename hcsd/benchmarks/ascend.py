"""Ascend: CANN's `aclblasGemmEx` (libacl_cblas.so) on FP16 matrices, AscendCL (libascendcl.so)
for the device, stream, memory and synchronisation.

Declarations from acl/acl_base.h, acl/acl_rt.h, acl/acl_op.h and acl/ops/acl_cblas.h: aclError
is an int, 0 for success; aclDataType ACL_FLOAT = 0, ACL_FLOAT16 = 1; aclTransType ACL_TRANS_N
= 0; aclComputeType ACL_COMPUTE_HIGH_PRECISION = 0; aclrtMemMallocPolicy
ACL_MEM_MALLOC_HUGE_FIRST = 0; aclrtMemcpyKind ACL_MEMCPY_HOST_TO_DEVICE = 1,
ACL_MEMCPY_DEVICE_TO_DEVICE = 3. The matrices are row-major and the leading dimensions are
reserved (-1). C is FP32 (FP16 inputs, FP32 result: the datasheets' dense FP16 figure) or FP16
(`accumulate = "fp16"`); alpha and beta have C's type and live in device memory (CANN reads
them on the device, as its gemm sample shows: aclrtMalloc'd and copied in with aclrtMemcpy).
`aclblasGemmEx` runs a GEMM single-operator model: CANN finds it in the directory given to
`aclopSetModelDir` (`measure.ascend_op_models`, compiled with ATC for this chip and size,
docs/discovery.md); without one it answers ACL_ERROR_OP_NOT_FOUND. The worker sees one NPU
(ASCEND_RT_VISIBLE_DEVICES), so the device is 0; aclrtGetDeviceCount must say 1. AscendCL's
runtime API has no PCI bus id query, so the id itself is trusted to be the one npu-smi and
DCMI report (benchmarks.placement).
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from hcsd.benchmarks.inputs import fill_random
from hcsd.benchmarks.libraries import BenchmarkError, Library, named_status, scalars
from hcsd.benchmarks.placement import check_device
from hcsd.benchmarks.request import GemmRequest

__all__ = ["AclblasGemm"]

ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_TRANS_N = 0
ACL_COMPUTE_HIGH_PRECISION = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_OP_NOT_FOUND = 100024

_ACL_ERROR = {
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100024: "ACL_ERROR_OP_NOT_FOUND",
    100025: "ACL_ERROR_OP_LOAD_FAILED",
    100026: "ACL_ERROR_UNSUPPORTED_DATA_TYPE",
}

_ptr = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t


_named = named_status(_ACL_ERROR, "aclError")


class OpModelMissing(BenchmarkError):
    """No compiled GEMM single-operator model: a setting to fix, not a moment's failure."""

    permanent = True


class AclblasGemm:
    """One NPU set up for `time_kernel`: A, B (FP16), C, two copy buffers, a stream."""

    def __init__(self, request: GemmRequest) -> None:
        dirs = request.library_path
        self.acl = Library(["libascendcl.so"], dirs)
        self.cblas = Library(["libacl_cblas.so"], dirs)
        self.library = self.cblas.name
        a = self.acl.checked
        self._acl_init = self.acl.function("aclInit", [ctypes.c_char_p])
        self._finalize = self.acl.function("aclFinalize", [])
        self._set_device = a("aclrtSetDevice", [ctypes.c_int32], _named)
        self._device_count = a("aclrtGetDeviceCount", [ctypes.POINTER(ctypes.c_uint32)], _named)
        self._reset_device = a("aclrtResetDevice", [ctypes.c_int32], _named)
        self._create_stream = a("aclrtCreateStream", [ctypes.POINTER(_ptr)], _named)
        self._destroy_stream = a("aclrtDestroyStream", [_ptr], _named)
        self._malloc = a("aclrtMalloc", [ctypes.POINTER(_ptr), _size, _int], _named)
        self._free = a("aclrtFree", [_ptr], _named)
        self._memset = a("aclrtMemset", [_ptr, _size, ctypes.c_int32, _size], _named)
        self._memcpy_sync = a("aclrtMemcpy", [_ptr, _size, _ptr, _size, _int], _named)
        self._memcpy = a("aclrtMemcpyAsync", [_ptr, _size, _ptr, _size, _int, _ptr], _named)
        self._sync = a("aclrtSynchronizeStream", [_ptr], _named)
        self._model_dir = a("aclopSetModelDir", [ctypes.c_char_p], _named)
        # transA, transB, transC, m, n, k, alpha, A, lda, typeA, B, ldb, typeB, beta, C, ldc,
        # typeC, computeType, stream
        gemm_args = [_int, _int, _int, _int, _int, _int, _ptr, _ptr, _int, _int, _ptr, _int]
        gemm_args += [_int, _ptr, _ptr, _int, _int, _int, _ptr]
        self._gemm_raw = self.cblas.function("aclblasGemmEx", gemm_args)

        self.m = self.n = self.k = request.size
        self.copy_bytes = request.copy_bytes if request.bandwidth else 0
        self._op_models = request.ascend_op_models
        self._c_type, c_bytes = (ACL_FLOAT, 4) if request.compute == "fp32" else (ACL_FLOAT16, 2)
        self._alpha, self._beta = scalars(request.compute)
        self._c_bytes = self.m * self.n * c_bytes
        self._buffers: list[int] = []
        self._stream = _ptr()
        self._device = False
        self._initialised = False
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        status = self._acl_init(None)
        if status not in (0, ACL_ERROR_REPEAT_INITIALIZE):
            raise BenchmarkError(f"aclInit returned {_named(status)}")
        self._initialised = True
        if self._op_models:
            self._model_dir(self._op_models.encode())
        count = ctypes.c_uint32()
        self._device_count(ctypes.byref(count))
        check_device(count.value, None, "")  # AscendCL reports no PCI bus id
        self._set_device(0)
        self._device = True
        self._create_stream(ctypes.byref(self._stream))
        matrix = self.m * self.k * 2
        self.a, self.b = (self._buffer(matrix, zero=False) for _ in range(2))
        self.c = self._buffer(self._c_bytes)
        for pointer in (self.a, self.b):
            fill_random(self, pointer, matrix)  # data, not zeros: see benchmarks.inputs
        self._alpha_device, self._beta_device = (self._scalar(x) for x in (self._alpha, self._beta))
        if self.copy_bytes:
            self.source, self.target = (self._buffer(self.copy_bytes) for _ in range(2))

    def _buffer(self, size: int, *, zero: bool = True) -> int:
        pointer = _ptr()
        self._malloc(ctypes.byref(pointer), size, ACL_MEM_MALLOC_HUGE_FIRST)
        assert pointer.value is not None
        self._buffers.append(pointer.value)
        if zero:
            self._memset(pointer.value, size, 0, size)
        return pointer.value

    def upload(self, pointer: int, data: bytes) -> None:
        kind = ACL_MEMCPY_HOST_TO_DEVICE
        self._memcpy_sync(pointer, len(data), data, len(data), kind)

    def tile(self, target: int, source: int, size: int) -> None:
        self._memcpy_sync(target, size, source, size, ACL_MEMCPY_DEVICE_TO_DEVICE)

    def _scalar(self, value: Any) -> int:
        """A device copy of alpha or beta."""
        size = ctypes.sizeof(value)
        pointer = self._buffer(size)
        self._memcpy_sync(pointer, size, ctypes.byref(value), size, ACL_MEMCPY_HOST_TO_DEVICE)
        return pointer

    def gemm(self) -> None:
        m, n, k, n_ = self.m, self.n, self.k, ACL_TRANS_N
        status = self._gemm_raw(
            n_, n_, n_, m, n, k, self._alpha_device, self.a, -1, ACL_FLOAT16,
            self.b, -1, ACL_FLOAT16, self._beta_device, self.c, -1, self._c_type,
            ACL_COMPUTE_HIGH_PRECISION, self._stream,
        )  # fmt: skip
        if status == ACL_ERROR_OP_NOT_FOUND:
            where = (
                f"in {self._op_models}"
                if self._op_models
                else "(measure.ascend_op_models is empty)"
            )
            raise OpModelMissing(
                f"aclblasGemmEx returned {_named(status)}: no compiled GEMM single-operator "
                f"model for {m}x{n}x{k} {where}; compile one with ATC (docs/discovery.md)"
            )
        if status != 0:
            raise BenchmarkError(f"aclblasGemmEx returned {_named(status)}")

    def copy(self) -> None:
        self._memcpy(
            self.target, self.copy_bytes, self.source, self.copy_bytes,
            ACL_MEMCPY_DEVICE_TO_DEVICE, self._stream,
        )  # fmt: skip

    def sync(self) -> None:
        self._sync(self._stream)

    def close(self) -> None:
        with contextlib.suppress(BenchmarkError):
            for pointer in self._buffers:
                self._free(pointer)
            self._buffers = []
            if self._stream.value:
                self._destroy_stream(self._stream)
                self._stream = _ptr()
            if self._device:
                self._reset_device(0)
                self._device = False
        if self._initialised:
            self._finalize()
            self._initialised = False
