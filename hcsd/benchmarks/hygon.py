"""Hygon DCU: rocBLAS `rocblas_gemm_ex` on FP16 matrices, the HIP runtime for the device,
memory and synchronisation (Hygon's DTK ships both, as ROCm does).

Declarations from rocblas-types.h, rocblas-functions.h and hip_runtime_api.h: statuses and
enums are C ints (rocblas_operation_none = 111, rocblas_datatype_f16_r = 150, f32_r = 151,
rocblas_gemm_algo_standard = 0; hipMemcpyHostToDevice = 1, hipMemcpyDeviceToDevice = 3);
`rocblas_gemm_ex` computes D = alpha·A·B + beta·C and here writes D over C (allowed when
ldc == ldd). The worker sees one
DCU (HIP_VISIBLE_DEVICES), so the device is ordinal 0, checked with hipGetDeviceCount and
hipDeviceGetPCIBusId (benchmarks.placement: HIP's numbering need not be the KFD's).
"""

from __future__ import annotations

import contextlib
import ctypes

from hcsd.benchmarks.inputs import fill_random
from hcsd.benchmarks.libraries import BenchmarkError, Library, named_status, scalars
from hcsd.benchmarks.placement import check_device
from hcsd.benchmarks.request import GemmRequest

__all__ = ["RocblasGemm"]

ROCBLAS_OPERATION_NONE = 111
ROCBLAS_DATATYPE_F16_R = 150
ROCBLAS_DATATYPE_F32_R = 151
ROCBLAS_GEMM_ALGO_STANDARD = 0
HIP_MEMCPY_HOST_TO_DEVICE = 1
HIP_MEMCPY_DEVICE_TO_DEVICE = 3

_ROCBLAS_STATUS = {
    1: "rocblas_status_invalid_handle",
    2: "rocblas_status_not_implemented",
    3: "rocblas_status_invalid_pointer",
    4: "rocblas_status_invalid_size",
    5: "rocblas_status_memory_error",
    6: "rocblas_status_internal_error",
    11: "rocblas_status_invalid_value",
    15: "rocblas_status_arch_mismatch",
}
_HIP_ERROR = {
    1: "hipErrorInvalidValue",
    2: "hipErrorOutOfMemory",
    3: "hipErrorNotInitialized",
    100: "hipErrorNoDevice",
    101: "hipErrorInvalidDevice",
}

_ptr = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t


class RocblasGemm:
    """One DCU set up for `time_kernel`: three FP16 matrices, two copy buffers, a handle."""

    def __init__(self, request: GemmRequest) -> None:
        dirs = request.library_path
        self.hip = Library(["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"], dirs)
        self.rocblas = Library(
            ["librocblas.so", "librocblas.so.4", "librocblas.so.3", "librocblas.so.0"], dirs
        )
        self.library = self.rocblas.name
        hip, blas = named_status(_HIP_ERROR), named_status(_ROCBLAS_STATUS)
        h, b = self.hip.checked, self.rocblas.checked
        self._set_device = h("hipSetDevice", [_int], hip)
        self._device_count = h("hipGetDeviceCount", [ctypes.POINTER(_int)], hip)
        self._bus_id = h("hipDeviceGetPCIBusId", [ctypes.c_char_p, _int, _int], hip)
        self._malloc = h("hipMalloc", [ctypes.POINTER(_ptr), _size], hip)
        self._free = h("hipFree", [_ptr], hip)
        self._memset = h("hipMemset", [_ptr, _int, _size], hip)
        self._memcpy = h("hipMemcpy", [_ptr, _ptr, _size, _int], hip)
        self._sync = h("hipDeviceSynchronize", [], hip)
        self._create = b("rocblas_create_handle", [ctypes.POINTER(_ptr)], blas)
        self._destroy = b("rocblas_destroy_handle", [_ptr], blas)
        # handle, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta,
        # c, c_type, ldc, d, d_type, ldd, compute_type, algo, solution_index, flags
        gemm_args = [_ptr, _int, _int, _int, _int, _int, _ptr, _ptr, _int, _int, _ptr, _int]
        gemm_args += [_int, _ptr, _ptr, _int, _int, _ptr, _int, _int, _int, _int, _int]
        gemm_args += [ctypes.c_uint32]
        self._gemm = b("rocblas_gemm_ex", gemm_args, blas)

        self.m = self.n = self.k = request.size
        self.copy_bytes = request.copy_bytes if request.bandwidth else 0
        self._expected_bus = request.pci_bus_id
        fp32 = request.compute == "fp32"
        self._compute = ROCBLAS_DATATYPE_F32_R if fp32 else ROCBLAS_DATATYPE_F16_R
        self._alpha, self._beta = scalars(request.compute)
        self._buffers: list[int] = []
        self._handle = _ptr()
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        count = _int()
        self._device_count(ctypes.byref(count))
        bus = ctypes.create_string_buffer(32)
        if count.value:
            self._bus_id(bus, len(bus), 0)
        check_device(count.value, bus.value.decode(), self._expected_bus)
        self._set_device(0)
        matrix = self.m * self.k * 2
        self.a, self.b = (self._buffer(matrix, zero=False) for _ in range(2))
        self.c = self._buffer(matrix)
        for pointer in (self.a, self.b):
            fill_random(self, pointer, matrix)  # data, not zeros: see benchmarks.inputs
        if self.copy_bytes:
            self.source, self.target = (self._buffer(self.copy_bytes) for _ in range(2))
        self._create(ctypes.byref(self._handle))

    def _buffer(self, size: int, *, zero: bool = True) -> int:
        pointer = _ptr()
        self._malloc(ctypes.byref(pointer), size)
        assert pointer.value is not None
        self._buffers.append(pointer.value)
        if zero:
            self._memset(pointer.value, 0, size)
        return pointer.value

    def upload(self, pointer: int, data: bytes) -> None:
        self._memcpy(pointer, data, len(data), HIP_MEMCPY_HOST_TO_DEVICE)

    def tile(self, target: int, source: int, size: int) -> None:
        self._memcpy(target, source, size, HIP_MEMCPY_DEVICE_TO_DEVICE)

    def gemm(self) -> None:
        m, n, k, f16 = self.m, self.n, self.k, ROCBLAS_DATATYPE_F16_R
        op = ROCBLAS_OPERATION_NONE
        self._gemm(
            self._handle, op, op, m, n, k, ctypes.byref(self._alpha), self.a, f16, m,
            self.b, f16, k, ctypes.byref(self._beta), self.c, f16, m, self.c, f16, m,
            self._compute, ROCBLAS_GEMM_ALGO_STANDARD, 0, 0,
        )  # fmt: skip

    def copy(self) -> None:
        self._memcpy(self.target, self.source, self.copy_bytes, HIP_MEMCPY_DEVICE_TO_DEVICE)

    def sync(self) -> None:
        self._sync()

    def close(self) -> None:
        with contextlib.suppress(BenchmarkError):
            if self._handle.value:
                self._destroy(self._handle)
                self._handle = _ptr()
            for pointer in self._buffers:
                self._free(pointer)
            self._buffers = []
