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
 */
#include <pthread.h>
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
};
static struct block blocks[MAX_BLOCKS];
static unsigned long long used[MAX_ORDINALS];
static CUdeviceptr next_ptr = 0x7f0000000000ULL;
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
API CUresult cuCtxSetCurrent(void *context) {
    (void)context;
    return CUDA_SUCCESS;
}
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
            blocks[i] = (struct block){next_ptr, size, ordinal};
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
