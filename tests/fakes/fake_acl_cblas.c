/*
 * A fake libacl_cblas.so (CANN) for the GEMM measurement's tests (hcsd/benchmarks/ascend.py):
 * aclblasGemmEx with acl_cblas.h's real ABI (aclTransType, aclDataType, aclComputeType as int;
 * aclrtStream a pointer), checking what CANN documents: transC ACL_TRANS_N; trans A/B N, T or
 * NZ; m, n, k positive; lda, ldb, ldc -1 (reserved); A and B FP16 (1), C FP16 or FP32 (0) with
 * alpha and beta of C's type and values 1 and 0, in device memory (aclrtMalloc'd and copied
 * in with aclrtMemcpy, as CANN's gemm sample does: CANN reads them on the device); a compute type 0 or 1; the stream the fake
 * AscendCL created; A, B and C allocations of it big enough (row-major). A violation prints why
 * and returns ACL_ERROR_INVALID_PARAM (100000). With FAKE_ACL_REQUIRE_OP_MODELS set and no
 * aclopSetModelDir before, it returns ACL_ERROR_OP_NOT_FOUND (100024), as CANN does without a
 * compiled GEMM single-op model. A valid call queues 2*m*n*k / (FAKE_ACL_TFLOPS * 1e12) seconds;
 * FAKE_ACL_STATUS forces a status; FAKE_ACL_LOG gets the first call's arguments.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

enum { ACL_FLOAT = 0, ACL_FLOAT16 = 1 };
enum { INVALID_PARAM = 100000, OP_NOT_FOUND = 100024 };

extern void fake_acl_enqueue(double seconds);
extern int fake_acl_block(const void *ptr, size_t size);
extern int fake_acl_stream(const void *stream);
extern int fake_acl_written(const void *ptr, size_t size, void *head);
extern const char *fake_acl_model_dir(void);

static long calls;

static int bad(const char *why) {
    fprintf(stderr, "fake aclblas: %s\n", why);
    return INVALID_PARAM;
}

API int aclblasGemmEx(int transA, int transB, int transC, int m, int n, int k, const void *alpha,
                      const void *A, int lda, int typeA, const void *B, int ldb, int typeB,
                      const void *beta, void *C, int ldc, int typeC, int compute, void *stream) {
    if (transC != 0) return bad("transC must be ACL_TRANS_N");
    if (transA < 0 || transA > 2 || transB < 0 || transB > 2)
        return bad("transA/transB must be ACL_TRANS_N, _T or _NZ");
    if (m <= 0 || n <= 0 || k <= 0) return bad("m, n and k must be positive");
    if (lda != -1 || ldb != -1 || ldc != -1) return bad("lda, ldb and ldc are reserved: -1");
    if (typeA != ACL_FLOAT16 || typeB != ACL_FLOAT16) return bad("A and B must be ACL_FLOAT16");
    if (typeC != ACL_FLOAT16 && typeC != ACL_FLOAT) return bad("C must be ACL_FLOAT16 or FLOAT");
    if (compute != 0 && compute != 1) return bad("compute type must be HIGH or LOW_PRECISION");
    if (!fake_acl_stream(stream)) return bad("not a live stream");
    if (!alpha || !beta) return bad("alpha or beta is NULL");
    /* CANN reads alpha and beta on the device: they must be device allocations, copied in. */
    if (typeC == ACL_FLOAT) {
        float x, y;
        if (!fake_acl_written(alpha, sizeof(x), &x) || !fake_acl_written(beta, sizeof(y), &y))
            return bad("alpha/beta are not device allocations copied in");
        if (x != 1.0f || y != 0.0f) return bad("alpha/beta are not the floats 1 and 0");
    } else {
        uint16_t x, y;
        if (!fake_acl_written(alpha, sizeof(x), &x) || !fake_acl_written(beta, sizeof(y), &y))
            return bad("alpha/beta are not device allocations copied in");
        if (x != 0x3c00 || y != 0) return bad("alpha/beta are not the halves 1 and 0");
    }
    size_t c_size = typeC == ACL_FLOAT ? 4 : 2;
    if (!fake_acl_block(A, (size_t)m * k * 2) || !fake_acl_block(B, (size_t)k * n * 2) ||
        !fake_acl_block(C, (size_t)m * n * c_size))
        return bad("A, B or C is not a device allocation of its size");
    if (!fake_acl_written(A, (size_t)m * k * 2, NULL) || !fake_acl_written(B, (size_t)k * n * 2, NULL))
        return bad("A or B was never written (copied in) before the GEMM");
    if (getenv("FAKE_ACL_REQUIRE_OP_MODELS") && !*fake_acl_model_dir()) return OP_NOT_FOUND;
    const char *forced = getenv("FAKE_ACL_STATUS");
    if (forced && atoi(forced)) return atoi(forced);
    const char *log = getenv("FAKE_ACL_LOG");
    if (calls++ == 0 && log) {
        FILE *f = fopen(log, "a");
        if (f) {
            fprintf(f, "gemm trans=%d,%d,%d m=%d n=%d k=%d lds=%d,%d,%d types=%d,%d,%d compute=%d models=%s\n",
                    transA, transB, transC, m, n, k, lda, ldb, ldc, typeA, typeB, typeC, compute,
                    fake_acl_model_dir());
            fclose(f);
        }
    }
    const char *text = getenv("FAKE_ACL_TFLOPS");
    double tflops = text ? atof(text) : 100.0;
    if (tflops > 0) fake_acl_enqueue(2.0 * (double)m * (double)n * (double)k / (tflops * 1e12));
    return 0;
}
