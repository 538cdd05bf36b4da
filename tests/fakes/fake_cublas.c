/*
 * A fake libcublas.so.12 for the GEMM measurement's tests (hcsd/benchmarks/nvidia.py): the
 * calls hcsd makes, with cuBLAS's real ABI as cublas_api.h and library_types.h declare it
 * (cublasStatus_t, cublasOperation_t, cudaDataType_t, cublasComputeType_t, cublasGemmAlgo_t
 * are C enums, passed as int), checking what a real cuBLAS would reject and more:
 *
 * - the handle is one cublasCreate_v2 handed out and not yet destroyed;
 * - transa/transb are CUBLAS_OP_N or CUBLAS_OP_T, m, n, k positive, lda/ldb/ldc at least the
 *   rows of the matrix as stored (column-major);
 * - A, B and C are FP16 (CUDA_R_16F), the compute type CUBLAS_COMPUTE_32F (alpha and beta
 *   floats) or CUBLAS_COMPUTE_16F (halves), the algorithm a default one;
 * - A, B and C are live allocations of the fake driver (fake_cuda.c), large enough for the
 *   matrix as stored, A and B written by copies (the inputs are data, not a memset), and
 *   alpha/beta host pointers that hold 1 and 0;
 * - a context is current (cublasCreate_v2 answers CUBLAS_STATUS_NOT_INITIALIZED without).
 *
 * A violation prints why on stderr and returns CUBLAS_STATUS_INVALID_VALUE. A valid call queues
 * 2*m*n*k / (FAKE_CUBLAS_TFLOPS * 1e12) seconds on the fake driver's stream, so what hcsd
 * measures is the configured speed. FAKE_CUBLAS_STATUS makes every GEMM return that status
 * (e.g. 13, CUBLAS_STATUS_EXECUTION_FAILED). FAKE_CUBLAS_LOG names a file that gets the first
 * GEMM's arguments and, at cublasDestroy_v2, the number of GEMMs. Built with
 * FAKE_CUBLAS_NO_GEMMEX the library lacks cublasGemmEx, as a cuBLAS older than 8.0 does.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int cublasStatus_t;
typedef struct fake_handle *cublasHandle_t;
typedef unsigned long long CUdeviceptr;

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum { CUDA_R_16F = 2 };
enum { CUBLAS_COMPUTE_16F = 64, CUBLAS_COMPUTE_32F = 68 };
enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };

struct fake_handle {
    int live;
    long gemms;
};

/* Exported by the fake libcuda.so.1 this library is linked against. */
extern void fake_cuda_enqueue(double seconds);
extern int fake_cuda_block(CUdeviceptr ptr, size_t size);
extern int fake_cuda_filled(CUdeviceptr ptr, size_t size);
extern void *fake_cuda_context(void);

#define MAX_HANDLES 64
static struct fake_handle handles[MAX_HANDLES];

static int bad(const char *why) {
    fprintf(stderr, "fake cublas: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

static int is_handle(cublasHandle_t handle) {
    return handle >= handles && handle < handles + MAX_HANDLES && handle->live;
}

API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle) return bad("cublasCreate_v2: handle is NULL");
    if (!fake_cuda_context()) {
        fprintf(stderr, "fake cublas: cublasCreate_v2: no current context\n");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    for (int i = 0; i < MAX_HANDLES; i++)
        if (!handles[i].live) {
            handles[i] = (struct fake_handle){1, 0};
            *handle = &handles[i];
            return CUBLAS_STATUS_SUCCESS;
        }
    return CUBLAS_STATUS_NOT_INITIALIZED;
}

static void log_line(const char *text) {
    const char *path = getenv("FAKE_CUBLAS_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!is_handle(handle)) return bad("cublasDestroy_v2: not a live handle");
    char line[64];
    snprintf(line, sizeof(line), "gemms=%ld\n", handle->gemms);
    log_line(line);
    handle->live = 0;
    return CUBLAS_STATUS_SUCCESS;
}

#ifndef FAKE_CUBLAS_NO_GEMMEX
/* Rows and columns of op(X) stored as rows x cols (column-major, leading dimension ld). */
static int check_matrix(const char *name, const void *ptr, int op, int rows, int cols, int ld,
                        int input) {
    int stored_rows = op == CUBLAS_OP_N ? rows : cols;
    int stored_cols = op == CUBLAS_OP_N ? cols : rows;
    char why[160];
    if (ld < stored_rows) {
        snprintf(why, sizeof(why), "ld%s=%d is below the %d rows of %s", name, ld, stored_rows,
                 name);
        return bad(why);
    }
    size_t bytes = (size_t)ld * (size_t)(stored_cols - 1) * 2 + (size_t)stored_rows * 2;
    if (!fake_cuda_block((CUdeviceptr)(uintptr_t)ptr, bytes)) {
        snprintf(why, sizeof(why), "%s=%p is not a device allocation of %zu bytes", name, ptr,
                 bytes);
        return bad(why);
    }
    if (input && !fake_cuda_filled((CUdeviceptr)(uintptr_t)ptr, bytes)) {
        snprintf(why, sizeof(why), "%s=%p was never written (copied in) before the GEMM", name,
                 ptr);
        return bad(why);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static int check_scalars(const void *alpha, const void *beta, int compute) {
    if (!alpha || !beta) return bad("alpha or beta is NULL");
    if (compute == CUBLAS_COMPUTE_32F) {
        float a, b;
        memcpy(&a, alpha, sizeof(a));
        memcpy(&b, beta, sizeof(b));
        if (a != 1.0f || b != 0.0f) return bad("alpha/beta are not the floats 1 and 0");
    } else {
        uint16_t a, b;
        memcpy(&a, alpha, sizeof(a));
        memcpy(&b, beta, sizeof(b));
        if (a != 0x3c00 || b != 0) return bad("alpha/beta are not the halves 1 and 0");
    }
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n,
                                int k, const void *alpha, const void *A, int Atype, int lda,
                                const void *B, int Btype, int ldb, const void *beta, void *C,
                                int Ctype, int ldc, int computeType, int algo) {
    if (!is_handle(handle)) return bad("cublasGemmEx: not a live handle");
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return bad("cublasGemmEx: transa/transb is not CUBLAS_OP_N or CUBLAS_OP_T");
    if (m <= 0 || n <= 0 || k <= 0) return bad("cublasGemmEx: m, n and k must be positive");
    if (Atype != CUDA_R_16F || Btype != CUDA_R_16F || Ctype != CUDA_R_16F)
        return bad("cublasGemmEx: A, B and C must be CUDA_R_16F");
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_16F)
        return bad("cublasGemmEx: compute type is not CUBLAS_COMPUTE_32F or _16F");
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
        return bad("cublasGemmEx: algorithm is not a default one");
    int status = check_scalars(alpha, beta, computeType);
    if (!status) status = check_matrix("A", A, transa, m, k, lda, 1);
    if (!status) status = check_matrix("B", B, transb, k, n, ldb, 1);
    if (!status) status = check_matrix("C", C, CUBLAS_OP_N, m, n, ldc, 0);
    if (status) return status;
    const char *forced = getenv("FAKE_CUBLAS_STATUS");
    if (forced && atoi(forced)) return atoi(forced);
    if (handle->gemms++ == 0) {
        char line[256];
        snprintf(line, sizeof(line),
                 "gemm transa=%d transb=%d m=%d n=%d k=%d types=%d,%d,%d lda=%d ldb=%d ldc=%d "
                 "compute=%d algo=%d\n",
                 transa, transb, m, n, k, Atype, Btype, Ctype, lda, ldb, ldc, computeType, algo);
        log_line(line);
    }
    const char *text = getenv("FAKE_CUBLAS_TFLOPS");
    double tflops = text ? atof(text) : 100.0;
    if (tflops > 0) fake_cuda_enqueue(2.0 * (double)m * (double)n * (double)k / (tflops * 1e12));
    return CUBLAS_STATUS_SUCCESS;
}
#endif
