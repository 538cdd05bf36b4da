/*
 * A fake libamdhip64.so (the HIP runtime Hygon's DTK ships, as ROCm does) for the GEMM
 * measurement's tests (hcsd/benchmarks/hygon.py): the calls hcsd makes, with hip_runtime_api.h's
 * types (hipError_t and hipMemcpyKind are C enums, passed as int). hipSetDevice accepts only the
 * ordinals HIP_VISIBLE_DEVICES leaves visible; memory is a counter, never touched; work is
 * queued on a stream that hipDeviceSynchronize waits for: a GEMM by the fake rocBLAS
 * (`fake_hip_enqueue`) and a device-to-device hipMemcpy at FAKE_HIP_COPY_GBPS GB/s.
 * `fake_hip_block` tells the fake rocBLAS whether a pointer is a live allocation,
 * `fake_hip_filled` whether copies (host to device, then device to device from written
 * memory) wrote a range.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))
#define MAX_BLOCKS 4096

enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorOutOfMemory = 2, hipErrorInvalidDevice = 101 };
enum { hipMemcpyHostToDevice = 1, hipMemcpyDeviceToDevice = 3 };

struct block {
    uintptr_t ptr;
    size_t size;
    size_t filled; /* bytes from the start that copies wrote (a memset does not count) */
};
static struct block blocks[MAX_BLOCKS];
static uintptr_t next_ptr = 0x7e0000000000ULL;
static double busy_until;
static int current = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int visible(void) {
    const char *list = getenv("HIP_VISIBLE_DEVICES");
    if (!list) return 8;
    int count = *list ? 1 : 0;
    for (const char *p = list; *p; p++) count += *p == ',';
    return count;
}

API void fake_hip_enqueue(double seconds) {
    pthread_mutex_lock(&lock);
    double now = now_seconds();
    busy_until = (busy_until > now ? busy_until : now) + seconds;
    pthread_mutex_unlock(&lock);
}

API int fake_hip_block(const void *ptr, size_t size) {
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS && !found; i++)
        if (blocks[i].ptr && p >= blocks[i].ptr && p + size <= blocks[i].ptr + blocks[i].size)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found && current >= 0;
}

API int hipGetDeviceCount(int *count) {
    if (!count) return hipErrorInvalidValue;
    *count = visible();
    return hipSuccess;
}

/* The bus id of ordinal `device`: its HIP_VISIBLE_DEVICES entry looked up in FAKE_HIP_BUS_IDS
 * (`index=bus` pairs); not listed: hipErrorInvalidDevice. */
API int hipDeviceGetPCIBusId(char *bus, int len, int device) {
    if (!bus || len < 13 || device < 0 || device >= visible()) return hipErrorInvalidValue;
    const char *list = getenv("HIP_VISIBLE_DEVICES");
    char index[32];
    snprintf(index, sizeof(index), "%d", device);
    for (int i = 0; list && *list; i++) {
        const char *end = strchr(list, ',');
        size_t item = end ? (size_t)(end - list) : strlen(list);
        if (i == device) {
            snprintf(index, sizeof(index), "%.*s", (int)item, list);
            break;
        }
        if (!end) break;
        list = end + 1;
    }
    size_t n = strlen(index);
    const char *pairs = getenv("FAKE_HIP_BUS_IDS");
    for (const char *p = pairs ? pairs : ""; *p;) {
        const char *end = strchr(p, ',');
        size_t item = end ? (size_t)(end - p) : strlen(p);
        if (item > n + 1 && !strncmp(p, index, n) && p[n] == '=') {
            snprintf(bus, (size_t)len, "%.*s", (int)(item - n - 1), p + n + 1);
            return hipSuccess;
        }
        if (!end) break;
        p = end + 1;
    }
    return hipErrorInvalidDevice;
}

API int hipSetDevice(int device) {
    if (device < 0 || device >= visible()) return hipErrorInvalidDevice;
    current = device;
    return hipSuccess;
}

API int hipMalloc(void **ptr, size_t size) {
    if (!ptr || !size || current < 0) return hipErrorInvalidValue;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (!blocks[i].ptr) {
            blocks[i] = (struct block){next_ptr, size, 0};
            *ptr = (void *)next_ptr;
            next_ptr += (size + 0xFFFFF) & ~(uintptr_t)0xFFFFF;
            pthread_mutex_unlock(&lock);
            return hipSuccess;
        }
    pthread_mutex_unlock(&lock);
    return hipErrorOutOfMemory;
}

API int hipFree(void *ptr) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (ptr && blocks[i].ptr == (uintptr_t)ptr) {
            blocks[i].ptr = 0;
            pthread_mutex_unlock(&lock);
            return hipSuccess;
        }
    pthread_mutex_unlock(&lock);
    return hipErrorInvalidValue;
}

API int hipMemset(void *ptr, int value, size_t size) {
    (void)value;
    return fake_hip_block(ptr, size) ? hipSuccess : hipErrorInvalidValue;
}

static struct block *find(uintptr_t p, size_t size) {
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].ptr && p >= blocks[i].ptr && p + size <= blocks[i].ptr + blocks[i].size)
            return &blocks[i];
    return NULL;
}

/* 1 when [ptr, ptr + size) lies in the written prefix of an allocation (the fake rocBLAS
 * refuses a GEMM on inputs nobody wrote). */
API int fake_hip_filled(const void *ptr, size_t size) {
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)ptr, size);
    int filled = b && (uintptr_t)ptr + size <= b->ptr + b->filled;
    pthread_mutex_unlock(&lock);
    return filled;
}

/* A copy wrote [ptr, ptr + size): the written prefix grows when the copy starts inside it. */
static void wrote(const void *ptr, size_t size) {
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)ptr, size);
    size_t offset = b ? (uintptr_t)ptr - b->ptr : 0;
    if (b && offset <= b->filled && offset + size > b->filled) b->filled = offset + size;
    pthread_mutex_unlock(&lock);
}

API int hipMemcpy(void *dst, const void *src, size_t size, int kind) {
    if (kind == hipMemcpyHostToDevice) {
        if (!src || !size || !fake_hip_block(dst, size)) return hipErrorInvalidValue;
        wrote(dst, size);
        return hipSuccess;
    }
    if (kind != hipMemcpyDeviceToDevice || !fake_hip_block(dst, size) || !fake_hip_block(src, size))
        return hipErrorInvalidValue;
    if (fake_hip_filled(src, size)) wrote(dst, size);
    const char *text = getenv("FAKE_HIP_COPY_GBPS");
    double gbps = text ? atof(text) : 1000.0;
    if (gbps > 0) fake_hip_enqueue(2.0 * (double)size / (gbps * 1e9));
    return hipSuccess;
}

API int hipDeviceSynchronize(void) {
    pthread_mutex_lock(&lock);
    double wait = busy_until - now_seconds();
    pthread_mutex_unlock(&lock);
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return hipSuccess;
}
