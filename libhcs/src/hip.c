/* HIP (Hygon DCU, via DTK/ROCm): allocations, frees and memory info. */
#include <pthread.h>

#include "common.h"

static const char *const libraries[] = {"libamdhip64.so", "libamdhip64.so.6",
					"libamdhip64.so.5", NULL};
static hipError_t (*real_hipMalloc)(void **, size_t);
static hipError_t (*real_hipMallocManaged)(void **, size_t, unsigned int);
static hipError_t (*real_hipMallocAsync)(void **, size_t, hipStream_t);
static hipError_t (*real_hipExtMallocWithFlags)(void **, size_t, unsigned int);
static hipError_t (*real_hipFree)(void *);
static hipError_t (*real_hipFreeAsync)(void *, hipStream_t);
static hipError_t (*real_hipMemGetInfo)(size_t *, size_t *);
static hipError_t (*real_hipGetDevice)(int *);
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
	HCS_RESOLVE(libraries, hipMalloc);
	HCS_RESOLVE(libraries, hipMallocManaged);
	HCS_RESOLVE(libraries, hipMallocAsync);
	HCS_RESOLVE(libraries, hipExtMallocWithFlags);
	HCS_RESOLVE(libraries, hipFree);
	HCS_RESOLVE(libraries, hipFreeAsync);
	HCS_RESOLVE(libraries, hipMemGetInfo);
	HCS_RESOLVE(libraries, hipGetDevice);
}

static inline int ordinal(void)
{
	int device = 0;
	if (real_hipGetDevice && real_hipGetDevice(&device) == hipSuccess)
		return device;
	return 0;
}

#define NOT_FOUND 500 /* hipErrorNotFound */
#define HIP_ALLOC(name, ptr, size, ...)                                                      \
	pthread_once(&once, resolve);                                                        \
	if (!real_##name)                                                                    \
		return NOT_FOUND;                                                            \
	if (!hcs_enforcing())                                                                \
		return real_##name(ptr, size, ##__VA_ARGS__);                                \
	int device = ordinal();                                                              \
	if (hcs_alloc_begin(device, size) != 0)                                              \
		return hipErrorOutOfMemory;                                                  \
	hipError_t rc = real_##name(ptr, size, ##__VA_ARGS__);                               \
	hcs_alloc_end(rc == hipSuccess, rc == hipSuccess ? (uint64_t)(uintptr_t)*(ptr) : 0,  \
		      HCS_KIND_HIP, device, size);                                           \
	return rc

hipError_t hcs_hipMalloc(void **ptr, size_t size) { HIP_ALLOC(hipMalloc, ptr, size); }

hipError_t hcs_hipMallocManaged(void **ptr, size_t size, unsigned int flags)
{
	HIP_ALLOC(hipMallocManaged, ptr, size, flags);
}

hipError_t hcs_hipMallocAsync(void **ptr, size_t size, hipStream_t stream)
{
	HIP_ALLOC(hipMallocAsync, ptr, size, stream);
}

hipError_t hcs_hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags)
{
	HIP_ALLOC(hipExtMallocWithFlags, ptr, size, flags);
}

#define HIP_FREE(name, ptr, ...)                                                             \
	pthread_once(&once, resolve);                                                        \
	if (!real_##name)                                                                    \
		return NOT_FOUND;                                                            \
	int device;                                                                          \
	uint64_t size;                                                                       \
	bool tracked = hcs_free_begin((uint64_t)(uintptr_t)(ptr), HCS_KIND_HIP, &device, &size); \
	hipError_t rc = real_##name(__VA_ARGS__);                                            \
	hcs_free_end(tracked, rc == hipSuccess, (uint64_t)(uintptr_t)(ptr), HCS_KIND_HIP,    \
		     device, size);                                                          \
	return rc

hipError_t hcs_hipFree(void *ptr) { HIP_FREE(hipFree, ptr, ptr); }

hipError_t hcs_hipFreeAsync(void *ptr, hipStream_t stream)
{
	HIP_FREE(hipFreeAsync, ptr, ptr, stream);
}

hipError_t hcs_hipMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	pthread_once(&once, resolve);
	if (!real_hipMemGetInfo)
		return NOT_FOUND;
	hipError_t rc = real_hipMemGetInfo(free_bytes, total_bytes);
	if (rc == hipSuccess && hcs_cfg.enforcing)
		hcs_clamp_info(ordinal(), free_bytes, total_bytes);
	return rc;
}
