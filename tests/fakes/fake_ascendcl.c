/*
 * A fake libascendcl.so (CANN's AscendCL) for the GEMM measurement's tests
 * (hcsd/benchmarks/ascend.py): the calls hcsd makes, with acl_base.h / acl_rt.h / acl_op.h's
 * types (aclError, aclrtMemMallocPolicy, aclrtMemcpyKind as int; aclrtStream a pointer).
 * aclrtSetDevice accepts only the ids ASCEND_RT_VISIBLE_DEVICES leaves visible; memory is a
 * counter, never touched; work is queued on the stream that aclrtSynchronizeStream waits for:
 * a GEMM by the fake aclblas (`fake_acl_enqueue`), an aclrtMemcpyAsync device to device at
 * FAKE_ACL_COPY_GBPS GB/s. aclrtMemcpy (host or device to device) records that an allocation
 * was written and keeps its first bytes, so the fake aclblas can require A and B filled and
 * alpha/beta in device memory holding 1 and 0. aclopSetModelDir remembers its directory, which the fake aclblas
 * requires when FAKE_ACL_REQUIRE_OP_MODELS is set (as CANN needs a compiled single-op model).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))
#define MAX_BLOCKS 4096

enum {
    ACL_SUCCESS = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_UNINITIALIZE = 100001,
    ACL_ERROR_REPEAT_INITIALIZE = 100002,
    ACL_ERROR_RT_PARAM_INVALID = 107000,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
};
enum { ACL_MEMCPY_HOST_TO_DEVICE = 1, ACL_MEMCPY_DEVICE_TO_DEVICE = 3 };

struct block {
    uintptr_t ptr;
    size_t size;
    size_t filled;         /* bytes from the start that copies wrote (not a memset) */
    unsigned char head[8]; /* the first bytes copied in from the host (alpha, beta) */
};
static struct block blocks[MAX_BLOCKS];
static uintptr_t next_ptr = 0x12c000000000ULL;
static double busy_until;
static int initialised, device = -1;
static char model_dir[4096];
static int streams_live;
static int stream_token; /* the address of this is the one stream handed out */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int visible(void) {
    const char *list = getenv("ASCEND_RT_VISIBLE_DEVICES");
    if (!list) return 8;
    int count = *list ? 1 : 0;
    for (const char *p = list; *p; p++) count += *p == ',';
    return count;
}

API void fake_acl_enqueue(double seconds) {
    pthread_mutex_lock(&lock);
    double now = now_seconds();
    busy_until = (busy_until > now ? busy_until : now) + seconds;
    pthread_mutex_unlock(&lock);
}

API int fake_acl_block(const void *ptr, size_t size) {
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS && !found; i++)
        if (blocks[i].ptr && p >= blocks[i].ptr && p + size <= blocks[i].ptr + blocks[i].size)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

static struct block *find(const void *ptr, size_t size) {
    uintptr_t p = (uintptr_t)ptr;
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].ptr && p >= blocks[i].ptr && p + size <= blocks[i].ptr + blocks[i].size)
            return &blocks[i];
    return NULL;
}

/* 1 when [ptr, ptr+size) lies in the written prefix of an allocation; its first bytes in
 * `head` when ptr is the allocation's start and head is not NULL (the scalars alpha, beta). */
API int fake_acl_written(const void *ptr, size_t size, void *head) {
    pthread_mutex_lock(&lock);
    struct block *b = find(ptr, size);
    int written = b && (uintptr_t)ptr + size <= b->ptr + b->filled;
    if (written && head && size <= sizeof(b->head) && (uintptr_t)ptr == b->ptr)
        memcpy(head, b->head, size);
    pthread_mutex_unlock(&lock);
    return written;
}

/* A copy wrote [ptr, ptr + count): the written prefix grows when the copy starts inside it. */
static void wrote(struct block *b, const void *ptr, size_t count) {
    size_t offset = (uintptr_t)ptr - b->ptr;
    if (offset <= b->filled && offset + count > b->filled) b->filled = offset + count;
}

API int fake_acl_stream(const void *stream) {
    return streams_live && stream == &stream_token;
}

API const char *fake_acl_model_dir(void) { return model_dir; }

API int aclInit(const char *config) {
    (void)config;
    if (initialised) return ACL_ERROR_REPEAT_INITIALIZE;
    initialised = 1;
    return ACL_SUCCESS;
}
API int aclFinalize(void) {
    initialised = 0;
    return ACL_SUCCESS;
}
API int aclopSetModelDir(const char *dir) {
    if (!initialised) return ACL_ERROR_UNINITIALIZE;
    if (!dir || !*dir) return ACL_ERROR_INVALID_PARAM;
    strncpy(model_dir, dir, sizeof(model_dir) - 1);
    return ACL_SUCCESS;
}
API int aclrtGetDeviceCount(uint32_t *count) {
    if (!count) return ACL_ERROR_INVALID_PARAM;
    *count = (uint32_t)visible();
    return ACL_SUCCESS;
}
API int aclrtSetDevice(int32_t id) {
    if (!initialised) return ACL_ERROR_UNINITIALIZE;
    if (id < 0 || id >= visible()) return ACL_ERROR_RT_PARAM_INVALID;
    device = id;
    return ACL_SUCCESS;
}
API int aclrtResetDevice(int32_t id) {
    if (id != device) return ACL_ERROR_RT_PARAM_INVALID;
    device = -1;
    return ACL_SUCCESS;
}
API int aclrtCreateStream(void **stream) {
    if (!stream || device < 0) return ACL_ERROR_INVALID_PARAM;
    streams_live = 1;
    *stream = &stream_token;
    return ACL_SUCCESS;
}
API int aclrtDestroyStream(void *stream) {
    if (!fake_acl_stream(stream)) return ACL_ERROR_INVALID_PARAM;
    streams_live = 0;
    return ACL_SUCCESS;
}
API int aclrtMalloc(void **ptr, size_t size, int policy) {
    if (!ptr || !size || device < 0 || policy < 0 || policy > 2) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (!blocks[i].ptr) {
            blocks[i] = (struct block){next_ptr, size, 0, {0}};
            *ptr = (void *)next_ptr;
            next_ptr += (size + 0xFFFFF) & ~(uintptr_t)0xFFFFF;
            pthread_mutex_unlock(&lock);
            return ACL_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
}
API int aclrtFree(void *ptr) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (ptr && blocks[i].ptr == (uintptr_t)ptr) {
            blocks[i].ptr = 0;
            pthread_mutex_unlock(&lock);
            return ACL_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return ACL_ERROR_INVALID_PARAM;
}
API int aclrtMemset(void *ptr, size_t max, int32_t value, size_t count) {
    (void)value;
    return count <= max && fake_acl_block(ptr, max) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}
API int aclrtMemcpyAsync(void *dst, size_t max, const void *src, size_t count, int kind,
                         void *stream) {
    if (kind != ACL_MEMCPY_DEVICE_TO_DEVICE || count > max || !fake_acl_stream(stream) ||
        !fake_acl_block(dst, max) || !fake_acl_block(src, count))
        return ACL_ERROR_INVALID_PARAM;
    const char *text = getenv("FAKE_ACL_COPY_GBPS");
    double gbps = text ? atof(text) : 1000.0;
    if (gbps > 0) fake_acl_enqueue(2.0 * (double)count / (gbps * 1e9));
    return ACL_SUCCESS;
}
/* aclrtMemcpy (synchronous): host to device marks the target written and keeps its first
 * bytes; device to device marks it written when the source was. */
API int aclrtMemcpy(void *dst, size_t max, const void *src, size_t count, int kind) {
    if (count > max || !src || !dst || !count) return ACL_ERROR_INVALID_PARAM;
    if (kind != ACL_MEMCPY_HOST_TO_DEVICE && kind != ACL_MEMCPY_DEVICE_TO_DEVICE)
        return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&lock);
    struct block *to = find(dst, max);
    struct block *from = kind == ACL_MEMCPY_DEVICE_TO_DEVICE ? find(src, count) : NULL;
    int status = ACL_SUCCESS;
    if (!to || (kind == ACL_MEMCPY_DEVICE_TO_DEVICE && !from)) {
        status = ACL_ERROR_INVALID_PARAM;
    } else if (kind == ACL_MEMCPY_HOST_TO_DEVICE) {
        wrote(to, dst, count);
        if ((uintptr_t)dst == to->ptr)
            memcpy(to->head, src, count < sizeof(to->head) ? count : sizeof(to->head));
    } else if ((uintptr_t)src + count <= from->ptr + from->filled) {
        wrote(to, dst, count);
    }
    pthread_mutex_unlock(&lock);
    return status;
}
API int aclrtSynchronizeStream(void *stream) {
    if (!fake_acl_stream(stream)) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&lock);
    double wait = busy_until - now_seconds();
    pthread_mutex_unlock(&lock);
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return ACL_SUCCESS;
}
