"""NVIDIA: cuBLAS `cublasGemmEx` on FP16 matrices, the driver API for the context, memory and
synchronisation.

Declarations from cublas_api.h, library_types.h and cuda.h (CUDA 11 and 12): statuses and
enums are C ints; `cublasGemmEx` takes `cublasComputeType_t` since CUDA 11 (libcublas.so.11
and .12; the CUDA 10 form with a cudaDataType compute type is not supported). The worker sees
one GPU (CUDA_VISIBLE_DEVICES is the device's UUID), so the device is ordinal 0, checked with
cuDeviceGetCount and cuDeviceGetPCIBusId (benchmarks.placement); its primary
context is the one cuBLAS's runtime uses, and it is released when the worker ends.
"""

from __future__ import annotations

import contextlib
import ctypes

from hcsd.benchmarks.inputs import fill_random
from hcsd.benchmarks.libraries import BenchmarkError, Library, named_status, scalars
from hcsd.benchmarks.placement import check_device
from hcsd.benchmarks.request import GemmRequest

__all__ = ["CublasGemm"]

CUBLAS_OP_N = 0
CUDA_R_16F = 2
CUBLAS_COMPUTE_16F = 64
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

_CUBLAS_STATUS = {
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}
_CU_RESULT = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}

_ptr = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t
_devptr = ctypes.c_uint64  # CUdeviceptr: unsigned long long on 64-bit hosts


class CublasGemm:
    """One GPU set up for `time_kernel`: three FP16 matrices, two copy buffers, a handle."""

    def __init__(self, request: GemmRequest) -> None:
        dirs = request.library_path
        self.cuda = Library(["libcuda.so.1"], dirs)
        self.cublas = Library(["libcublas.so.12", "libcublas.so.11"], dirs)
        self.library = self.cublas.name
        cu = named_status(_CU_RESULT)
        blas = named_status(_CUBLAS_STATUS)
        c, b = self.cuda.checked, self.cublas.checked
        # Bind everything first: a missing symbol is reported before the device is touched.
        self._init = c("cuInit", [ctypes.c_uint], cu)
        self._device_get = c("cuDeviceGet", [ctypes.POINTER(_int), _int], cu)
        self._device_count = c("cuDeviceGetCount", [ctypes.POINTER(_int)], cu)
        self._bus_id = c("cuDeviceGetPCIBusId", [ctypes.c_char_p, _int, _int], cu)
        self._retain = c("cuDevicePrimaryCtxRetain", [ctypes.POINTER(_ptr), _int], cu)
        self._release = c("cuDevicePrimaryCtxRelease_v2", [_int], cu)
        self._set_current = c("cuCtxSetCurrent", [_ptr], cu)
        self._alloc = c("cuMemAlloc_v2", [ctypes.POINTER(_devptr), _size], cu)
        self._free = c("cuMemFree_v2", [_devptr], cu)
        self._memset = c("cuMemsetD8_v2", [_devptr, ctypes.c_ubyte, _size], cu)
        self._memcpy = c("cuMemcpyDtoD_v2", [_devptr, _devptr, _size], cu)
        self._upload = c("cuMemcpyHtoD_v2", [_devptr, ctypes.c_char_p, _size], cu)
        self._sync = c("cuCtxSynchronize", [], cu)
        self._create = b("cublasCreate_v2", [ctypes.POINTER(_ptr)], blas)
        self._destroy = b("cublasDestroy_v2", [_ptr], blas)
        # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
        # Ctype, ldc, computeType, algo
        gemm_args = [_ptr, _int, _int, _int, _int, _int, _ptr, _ptr, _int, _int]
        gemm_args += [_ptr, _int, _int, _ptr, _ptr, _int, _int, _int, _int]
        self._gemm = b("cublasGemmEx", gemm_args, blas)

        self.m = self.n = self.k = request.size
        self.copy_bytes = request.copy_bytes if request.bandwidth else 0
        self._expected_bus = request.pci_bus_id
        self._compute = CUBLAS_COMPUTE_32F if request.compute == "fp32" else CUBLAS_COMPUTE_16F
        self._alpha, self._beta = scalars(request.compute)
        self._buffers: list[int] = []
        self._device = _int(-1)
        self._handle = _ptr()
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        self._init(0)
        count = _int()
        self._device_count(ctypes.byref(count))
        device = _int()
        self._device_get(ctypes.byref(device), 0)
        bus = ctypes.create_string_buffer(32)
        self._bus_id(bus, len(bus), device.value)
        check_device(count.value, bus.value.decode(), self._expected_bus)
        self._device = device
        context = _ptr()
        self._retain(ctypes.byref(context), self._device.value)
        self._set_current(context)
        matrix = self.m * self.k * 2  # FP16, square: A, B and C are the same size
        self.a, self.b = (self._buffer(matrix, zero=False) for _ in range(2))
        self.c = self._buffer(matrix)
        for pointer in (self.a, self.b):
            fill_random(self, pointer, matrix)  # data, not zeros: see benchmarks.inputs
        self._sync()
        if self.copy_bytes:
            self.source, self.target = (self._buffer(self.copy_bytes) for _ in range(2))
        self._create(ctypes.byref(self._handle))

    def _buffer(self, size: int, *, zero: bool = True) -> int:
        pointer = _devptr()
        self._alloc(ctypes.byref(pointer), size)
        self._buffers.append(pointer.value)
        if zero:
            self._memset(pointer.value, 0, size)  # finite: no NaN arithmetic timed
        return pointer.value

    def upload(self, pointer: int, data: bytes) -> None:
        self._upload(pointer, data, len(data))

    def tile(self, target: int, source: int, size: int) -> None:
        self._memcpy(target, source, size)

    def gemm(self) -> None:
        m, n, k = self.m, self.n, self.k
        self._gemm(
            self._handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, ctypes.byref(self._alpha),
            self.a, CUDA_R_16F, m, self.b, CUDA_R_16F, k, ctypes.byref(self._beta),
            self.c, CUDA_R_16F, m, self._compute, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    def copy(self) -> None:
        self._memcpy(self.target, self.source, self.copy_bytes)

    def sync(self) -> None:
        self._sync()

    def close(self) -> None:
        """Free what was set up; the worker's exit would too, this keeps the order clean."""
        with contextlib.suppress(BenchmarkError):
            if self._handle.value:
                self._destroy(self._handle)
                self._handle = _ptr()
            for pointer in self._buffers:
                self._free(pointer)
            self._buffers = []
            if self._device.value >= 0:
                self._release(self._device.value)
                self._device = _int(-1)
