/*
 * A fake libcuda.so.1 that plays the kernel driver's part for the VRAM watchdog's tests: the
 * allocation calls libhcs hooks (cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuCtxGetDevice, and
 * the primary-context calls bench/gpu/real_cuda.c makes)
 * with the driver API's types and codes, and after every change it publishes this process's
 * usage per GPU in FAKE_GPU_STATE/<pid> (lines `<gpu> <bytes>`, written to a temporary file and
 * renamed), which the fake NVML reads to answer nvmlDeviceGetComputeRunningProcesses. So what
 * NVML reports is what the process really allocated, whether or not libhcs was in the way.
 *
 * The current device is ordinal FAKE_CUDA_DEVICE (default 0); ordinal i is the i-th entry of
 * CUDA_VISIBLE_DEVICES (a GPU uuid, or an index written as `index:N`), as the driver maps them.
 * No memory is touched: a pointer is a counter, so tests may "allocate" terabytes.
 *
 * For the GEMM measurement (hcsd/benchmarks) it also plays a stream: work is queued by
 * `fake_cuda_enqueue` (the fake cuBLAS calls it with the time a GEMM takes at the configured
 * speed) and by cuMemcpyDtoD_v2 (at FAKE_CUDA_COPY_GBPS GB/s, read + write counted), and
 * cuCtxSynchronize sleeps until the queue is done, as the real call blocks until the device
 * is idle. `fake_cuda_block` tells the fake cuBLAS whether a pointer is a live allocation of
 * at least some size, so it can refuse pointers this driver never handed out;
 * `fake_cuda_filled` whether copies (cuMemcpyHtoD_v2, then cuMemcpyDtoD_v2 from written
 * memory) wrote a range, so it can refuse a GEMM on inputs nobody wrote; `fake_cuda_context`
 * is the context cuCtxSetCurrent made current.
 */
#include <pthread.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MAX_ORDINALS 16
#define MAX_BLOCKS 65536

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

struct block {
    CUdeviceptr ptr;
    size_t size;
    int ordinal;
    size_t filled; /* bytes from the start that copies wrote (a memset does not count) */
};
static struct block blocks[MAX_BLOCKS];
static unsigned long long used[MAX_ORDINALS];
static CUdeviceptr next_ptr = 0x7f0000000000ULL;
static void *context; /* the current context (cuCtxSetCurrent) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int current(void) {
    const char *text = getenv("FAKE_CUDA_DEVICE");
    int ordinal = text ? atoi(text) : 0;
    return ordinal >= 0 && ordinal < MAX_ORDINALS ? ordinal : 0;
}

static unsigned long long capacity(void) {
    const char *text = getenv("FAKE_CUDA_TOTAL");
    return text ? strtoull(text, NULL, 0) : 80ULL << 30;
}

/* The name of ordinal i in CUDA_VISIBLE_DEVICES; `index:i` when the variable is unset. */
static void gpu_name(int ordinal, char *out, size_t size) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(out, size, "index:%d", ordinal);
    if (!visible) return;
    int i = 0;
    for (const char *p = visible; *p; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (i == ordinal) {
            if (len && p[0] >= '0' && p[0] <= '9')
                snprintf(out, size, "index:%.*s", (int)len, p);
            else
                snprintf(out, size, "%.*s", (int)len, p);
            return;
        }
        if (!end) break;
        p = end + 1;
    }
}

static void publish(void) {
    const char *dir = getenv("FAKE_GPU_STATE");
    if (!dir) return;
    char path[4096], tmp[4200], name[128];
    snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < MAX_ORDINALS; i++)
        if (used[i]) {
            gpu_name(i, name, sizeof(name));
            fprintf(f, "%s %llu\n", name, used[i]);
        }
    if (fclose(f) == 0) rename(tmp, path);
}

API CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
/* The devices CUDA_VISIBLE_DEVICES leaves (8 when unset), and their bus ids: FAKE_CUDA_BUS_IDS
 * lists `name=bus` pairs (name as in CUDA_VISIBLE_DEVICES); a device not listed has none. */
API CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    int n = visible ? (*visible ? 1 : 0) : 8;
    for (const char *p = visible ? visible : ""; *p; p++) n += *p == ',';
    *count = n;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice device) {
    char name[128];
    int count = 0;
    cuDeviceGetCount(&count);
    if (!bus || len < 13 || device < 0 || device >= count) return CUDA_ERROR_INVALID_VALUE;
    gpu_name(device, name, sizeof(name));
    const char *pairs = getenv("FAKE_CUDA_BUS_IDS");
    size_t n = strlen(name);
    for (const char *p = pairs ? pairs : ""; *p;) {
        const char *end = strchr(p, ',');
        size_t item = end ? (size_t)(end - p) : strlen(p);
        if (item > n + 1 && !strncmp(p, name, n) && p[n] == '=') {
            snprintf(bus, (size_t)len, "%.*s", (int)(item - n - 1), p + n + 1);
            return CUDA_SUCCESS;
        }
        if (!end) break;
        p = end + 1;
    }
    return 101; /* CUDA_ERROR_INVALID_DEVICE */
}
/* Contexts: the primary context of a device, made current (as the runtime does it). */
API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device || ordinal < 0 || ordinal >= MAX_ORDINALS) return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(void **context, CUdevice device) {
    if (!context) return CUDA_ERROR_INVALID_VALUE;
    *context = (void *)(uintptr_t)(device + 1);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(void *ctx) {
    context = ctx;
    return CUDA_SUCCESS;
}
/* Not a CUDA symbol: the current context, which the fake cuBLAS requires (as cuBLAS works in
 * the calling thread's current context). */
API void *fake_cuda_context(void) { return context; }
API CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = current();
    return CUDA_SUCCESS;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
    int ordinal = current();
    pthread_mutex_lock(&lock);
    if (used[ordinal] + size > capacity()) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (!blocks[i].ptr) {
            blocks[i] = (struct block){next_ptr, size, ordinal, 0};
            *ptr = next_ptr;
            next_ptr += (size + 0xFFFFF) & ~0xFFFFFULL;
            used[ordinal] += size;
            publish();
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (ptr && blocks[i].ptr == ptr) {
            used[blocks[i].ordinal] -= blocks[i].size;
            blocks[i].ptr = 0;
            publish();
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *total_bytes = (size_t)capacity();
    *free_bytes = (size_t)(capacity() - used[current()]);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* -- the stream, for the GEMM measurement ------------------------------------------------- */
static double busy_until; /* CLOCK_MONOTONIC seconds when the queued work is done */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Not a CUDA symbol: the fake cuBLAS queues a GEMM's duration here. */
API void fake_cuda_enqueue(double seconds) {
    pthread_mutex_lock(&lock);
    double now = now_seconds();
    busy_until = (busy_until > now ? busy_until : now) + seconds;
    pthread_mutex_unlock(&lock);
}

/* Not a CUDA symbol: 1 when [ptr, ptr + size) lies inside one live allocation. */
API int fake_cuda_block(CUdeviceptr ptr, size_t size) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS && !found; i++)
        if (blocks[i].ptr && ptr >= blocks[i].ptr && ptr + size <= blocks[i].ptr + blocks[i].size)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

API CUresult cuCtxSynchronize(void) {
    pthread_mutex_lock(&lock);
    double wait = busy_until - now_seconds();
    pthread_mutex_unlock(&lock);
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return device >= 0 && device < MAX_ORDINALS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t count) {
    (void)value;
    return fake_cuda_block(ptr, count) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static struct block *find(CUdeviceptr ptr, size_t size) {
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].ptr && ptr >= blocks[i].ptr && ptr + size <= blocks[i].ptr + blocks[i].size)
            return &blocks[i];
    return NULL;
}

/* A copy wrote [ptr, ptr + count): the allocation's written prefix grows when the copy starts
 * inside it (the host fills the start, device copies tile the rest). Under the lock. */
static void wrote(CUdeviceptr ptr, size_t count) {
    struct block *b = find(ptr, count);
    size_t offset = b ? (size_t)(ptr - b->ptr) : 0;
    if (b && offset <= b->filled && offset + count > b->filled) b->filled = offset + count;
}

/* Not a CUDA symbol: 1 when [ptr, ptr + size) lies in the written prefix of an allocation, so
 * the fake cuBLAS can refuse a GEMM on inputs nobody wrote. */
API int fake_cuda_filled(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&lock);
    struct block *b = find(ptr, size);
    int filled = b && ptr + size <= b->ptr + b->filled;
    pthread_mutex_unlock(&lock);
    return filled;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t count) {
    if (!count || !src || !fake_cuda_block(dst, count)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    wrote(dst, count);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t count) {
    if (!count || !fake_cuda_block(dst, count) || !fake_cuda_block(src, count))
        return CUDA_ERROR_INVALID_VALUE;
    if (fake_cuda_filled(src, count)) {
        pthread_mutex_lock(&lock);
        wrote(dst, count);
        pthread_mutex_unlock(&lock);
    }
    const char *text = getenv("FAKE_CUDA_COPY_GBPS");
    double gbps = text ? atof(text) : 1000.0;
    if (gbps > 0) fake_cuda_enqueue(2.0 * (double)count / (gbps * 1e9));
    return CUDA_SUCCESS;
}
