/*
 * A fake librocblas.so for the GEMM measurement's tests (hcsd/benchmarks/hygon.py), with
 * rocBLAS's real ABI (rocblas-types.h, rocblas-functions.h: rocblas_status, rocblas_operation,
 * rocblas_datatype and rocblas_gemm_algo are C enums, passed as int), checking what rocBLAS
 * would reject and more: a live handle; operations none/transpose (111/112); m, n, k positive;
 * A, B, C and D FP16 (150) with leading dimensions at least the rows as stored; compute type
 * f32 (151, alpha/beta floats 1 and 0) or f16 (150, halves); the standard algorithm (0),
 * solution index 0 and flags 0; C and D the same or both live, all pointers allocations of the
 * fake HIP runtime, A and B written by copies (data, not a memset). A violation prints why and returns rocblas_status_invalid_value (11) or
 * rocblas_status_invalid_pointer (3). A valid call queues 2*m*n*k / (FAKE_ROCBLAS_TFLOPS *
 * 1e12) seconds on the fake HIP stream; FAKE_ROCBLAS_STATUS forces a status; FAKE_ROCBLAS_LOG
 * gets the first call's arguments.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

enum { ok = 0, invalid_handle = 1, invalid_pointer = 3, invalid_size = 4, invalid_value = 11 };
enum { op_none = 111, op_transpose = 112, f16_r = 150, f32_r = 151 };

struct handle {
    int live;
    long gemms;
};
#define MAX_HANDLES 16
static struct handle handles[MAX_HANDLES];

extern void fake_hip_enqueue(double seconds);
extern int fake_hip_block(const void *ptr, size_t size);
extern int fake_hip_filled(const void *ptr, size_t size);

static int bad(int status, const char *why) {
    fprintf(stderr, "fake rocblas: %s\n", why);
    return status;
}

API int rocblas_create_handle(struct handle **out) {
    if (!out) return invalid_pointer;
    for (int i = 0; i < MAX_HANDLES; i++)
        if (!handles[i].live) {
            handles[i] = (struct handle){1, 0};
            *out = &handles[i];
            return ok;
        }
    return invalid_handle;
}

static int live(const struct handle *h) {
    return h >= handles && h < handles + MAX_HANDLES && h->live;
}

API int rocblas_destroy_handle(struct handle *h) {
    if (!live(h)) return bad(invalid_handle, "rocblas_destroy_handle: not a live handle");
    h->live = 0;
    return ok;
}

static int matrix(const char *name, const void *p, int op, int rows, int cols, int ld,
                  int input) {
    int stored_rows = op == op_none ? rows : cols, stored_cols = op == op_none ? cols : rows;
    char why[160];
    if (ld < stored_rows) {
        snprintf(why, sizeof(why), "ld%s=%d is below the %d rows of %s", name, ld, stored_rows, name);
        return bad(invalid_size, why);
    }
    size_t bytes = (size_t)ld * (size_t)(stored_cols - 1) * 2 + (size_t)stored_rows * 2;
    if (!fake_hip_block(p, bytes)) {
        snprintf(why, sizeof(why), "%s=%p is not a device allocation of %zu bytes", name, p, bytes);
        return bad(invalid_pointer, why);
    }
    if (input && !fake_hip_filled(p, bytes)) {
        snprintf(why, sizeof(why), "%s=%p was never written (copied in) before the GEMM", name, p);
        return bad(invalid_value, why);
    }
    return ok;
}

API int rocblas_gemm_ex(struct handle *h, int trans_a, int trans_b, int m, int n, int k,
                        const void *alpha, const void *a, int a_type, int lda, const void *b,
                        int b_type, int ldb, const void *beta, const void *c, int c_type,
                        int ldc, void *d, int d_type, int ldd, int compute_type, int algo,
                        int32_t solution_index, uint32_t flags) {
    if (!live(h)) return bad(invalid_handle, "rocblas_gemm_ex: not a live handle");
    if ((trans_a != op_none && trans_a != op_transpose) ||
        (trans_b != op_none && trans_b != op_transpose))
        return bad(invalid_value, "rocblas_gemm_ex: operation is not none or transpose");
    if (m <= 0 || n <= 0 || k <= 0) return bad(invalid_size, "rocblas_gemm_ex: m, n, k <= 0");
    if (a_type != f16_r || b_type != f16_r || c_type != f16_r || d_type != f16_r)
        return bad(invalid_value, "rocblas_gemm_ex: A, B, C and D must be f16_r");
    if (compute_type != f32_r && compute_type != f16_r)
        return bad(invalid_value, "rocblas_gemm_ex: compute type is not f32_r or f16_r");
    if (algo != 0 || solution_index != 0 || flags != 0)
        return bad(invalid_value, "rocblas_gemm_ex: not the standard algorithm, index 0, flags 0");
    if (!alpha || !beta) return bad(invalid_pointer, "rocblas_gemm_ex: alpha or beta is NULL");
    if (compute_type == f32_r) {
        float x, y;
        memcpy(&x, alpha, sizeof(x));
        memcpy(&y, beta, sizeof(y));
        if (x != 1.0f || y != 0.0f) return bad(invalid_value, "alpha/beta are not floats 1, 0");
    } else {
        uint16_t x, y;
        memcpy(&x, alpha, sizeof(x));
        memcpy(&y, beta, sizeof(y));
        if (x != 0x3c00 || y != 0) return bad(invalid_value, "alpha/beta are not halves 1, 0");
    }
    int status = matrix("A", a, trans_a, m, k, lda, 1);
    if (!status) status = matrix("B", b, trans_b, k, n, ldb, 1);
    if (!status) status = matrix("C", c, op_none, m, n, ldc, 0);
    if (!status) status = matrix("D", d, op_none, m, n, ldd, 0);
    if (status) return status;
    if (c == d && ldc != ldd) return bad(invalid_size, "rocblas_gemm_ex: C is D but ldc != ldd");
    const char *forced = getenv("FAKE_ROCBLAS_STATUS");
    if (forced && atoi(forced)) return atoi(forced);
    const char *log = getenv("FAKE_ROCBLAS_LOG");
    if (h->gemms++ == 0 && log) {
        FILE *f = fopen(log, "a");
        if (f) {
            fprintf(f, "gemm m=%d n=%d k=%d types=%d,%d,%d,%d lds=%d,%d,%d,%d compute=%d inplace=%d\n",
                    m, n, k, a_type, b_type, c_type, d_type, lda, ldb, ldc, ldd, compute_type,
                    c == d);
            fclose(f);
        }
    }
    const char *text = getenv("FAKE_ROCBLAS_TFLOPS");
    double tflops = text ? atof(text) : 100.0;
    if (tflops > 0) fake_hip_enqueue(2.0 * (double)m * (double)n * (double)k / (tflops * 1e12));
    return ok;
}
