/* CUDA driver API: allocations (plain, pitched, managed, stream-ordered, pool), VMM physical
 * handles, frees, memory info, and cuGetProcAddress (cudart 12 resolves the driver through it,
 * so its answers must be our hooks). The device is the current context's. */
#include <pthread.h>
#include <string.h>

#include "common.h"
#include "hooks.h"

static const char *const libraries[] = {"libcuda.so.1", "libcuda.so", NULL};

static CUresult (*real_cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*real_cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
static CUresult (*real_cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
static CUresult (*real_cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
static CUresult (*real_cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*real_cuMemFree_v2)(CUdeviceptr);
static CUresult (*real_cuMemFreeAsync)(CUdeviceptr, CUstream);
static CUresult (*real_cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const void *,
				    unsigned long long);
static CUresult (*real_cuMemRelease)(CUmemGenericAllocationHandle);
static CUresult (*real_cuMemGetInfo_v2)(size_t *, size_t *);
static CUresult (*real_cuGetProcAddress)(const char *, void **, int, cuuint64_t);
static CUresult (*real_cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
					    CUdriverProcAddressQueryResult *);
static CUresult (*real_cuCtxGetDevice)(CUdevice *);
static pthread_once_t once = PTHREAD_ONCE_INIT;
static CUresult (*real_cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
				       unsigned int, unsigned int, unsigned int, unsigned int,
				       CUstream, void **, void **);
static CUresult (*real_cuLaunchKernelEx)(const void *, CUfunction, void **, void **);
static CUresult (*real_cuGraphLaunch)(CUgraphExec, CUstream);
static pthread_once_t launch_once = PTHREAD_ONCE_INIT;

static void resolve_launch(void)
{
	HCS_RESOLVE(libraries, cuLaunchKernel);
	HCS_RESOLVE(libraries, cuLaunchKernelEx);
	HCS_RESOLVE(libraries, cuGraphLaunch);
}

static void resolve(void)
{
	HCS_RESOLVE(libraries, cuMemAlloc_v2);
	HCS_RESOLVE(libraries, cuMemAllocPitch_v2);
	HCS_RESOLVE(libraries, cuMemAllocManaged);
	HCS_RESOLVE(libraries, cuMemAllocAsync);
	HCS_RESOLVE(libraries, cuMemAllocFromPoolAsync);
	HCS_RESOLVE(libraries, cuMemFree_v2);
	HCS_RESOLVE(libraries, cuMemFreeAsync);
	HCS_RESOLVE(libraries, cuMemCreate);
	HCS_RESOLVE(libraries, cuMemRelease);
	HCS_RESOLVE(libraries, cuMemGetInfo_v2);
	HCS_RESOLVE(libraries, cuGetProcAddress);
	HCS_RESOLVE(libraries, cuGetProcAddress_v2);
	HCS_RESOLVE(libraries, cuCtxGetDevice);
}

static inline void ready(void)
{
	pthread_once(&once, resolve);
}

static inline int ordinal(void)
{
	CUdevice device = 0;
	if (real_cuCtxGetDevice && real_cuCtxGetDevice(&device) == CUDA_SUCCESS)
		return device;
	return 0;
}

#define MISSING(name) do { if (!real_##name) return CUDA_ERROR_NOT_FOUND; } while (0)

/* One body for every allocation that returns a device pointer. */
#define CUDA_ALLOC(name, dptr, size, ...)                                                    \
	ready();                                                                             \
	MISSING(name);                                                                       \
	if (!hcs_enforcing())                                                                \
		return real_##name(dptr, size, ##__VA_ARGS__);                               \
	int device = ordinal();                                                              \
	if (hcs_alloc_begin(device, size) != 0)                                              \
		return CUDA_ERROR_OUT_OF_MEMORY;                                             \
	CUresult rc = real_##name(dptr, size, ##__VA_ARGS__);                                \
	hcs_alloc_end(rc == CUDA_SUCCESS, rc == CUDA_SUCCESS ? *(dptr) : 0, HCS_KIND_PTR,   \
		      device, size);                                                         \
	return rc

CUresult hcs_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
	CUDA_ALLOC(cuMemAlloc_v2, dptr, size);
}

CUresult hcs_cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
	CUDA_ALLOC(cuMemAllocManaged, dptr, size, flags);
}

CUresult hcs_cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
	CUDA_ALLOC(cuMemAllocAsync, dptr, size, stream);
}

CUresult hcs_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
				     CUstream stream)
{
	CUDA_ALLOC(cuMemAllocFromPoolAsync, dptr, size, pool, stream);
}

/* The pitch is chosen by the driver: reserve width x height first, the rest once known. */
CUresult hcs_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
				unsigned int element_size)
{
	ready();
	MISSING(cuMemAllocPitch_v2);
	if (!hcs_enforcing())
		return real_cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
	int device = ordinal();
	uint64_t estimate = (uint64_t)width * height;
	if (hcs_alloc_begin(device, estimate) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = real_cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
	uint64_t actual = rc == CUDA_SUCCESS ? (uint64_t)*pitch * height : estimate;
	if (rc == CUDA_SUCCESS && actual > estimate && hcs_reserve(device, actual - estimate) != 0) {
		real_cuMemFree_v2(*dptr);
		hcs_alloc_end(false, 0, HCS_KIND_PTR, device, estimate);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (rc == CUDA_SUCCESS && actual < estimate)
		hcs_unreserve(device, estimate - actual);
	hcs_alloc_end(rc == CUDA_SUCCESS, rc == CUDA_SUCCESS ? *dptr : 0, HCS_KIND_PTR, device,
		      rc == CUDA_SUCCESS ? actual : estimate);
	return rc;
}

#define CUDA_FREE(name, kind, key, ...)                                                       \
	ready();                                                                             \
	MISSING(name);                                                                       \
	int device;                                                                          \
	uint64_t size;                                                                       \
	bool tracked = hcs_free_begin((uint64_t)(key), kind, &device, &size);                \
	CUresult rc = real_##name(__VA_ARGS__);                                              \
	hcs_free_end(tracked, rc == CUDA_SUCCESS, (uint64_t)(key), kind, device, size);       \
	return rc

CUresult hcs_cuMemFree_v2(CUdeviceptr dptr)
{
	CUDA_FREE(cuMemFree_v2, HCS_KIND_PTR, dptr, dptr);
}

/* Stream-ordered free: the memory returns when the stream gets there; crediting it now is the
 * only point we see, and the pool reuses it for this process first. */
CUresult hcs_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	CUDA_FREE(cuMemFreeAsync, HCS_KIND_PTR, dptr, dptr, stream);
}

/* VMM: CUmemAllocationProp starts {int type; int requestedHandleTypes; {int type; int id;}
 * location; ...}: the device ordinal is location.id. */
CUresult hcs_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
			 unsigned long long flags)
{
	ready();
	MISSING(cuMemCreate);
	if (!hcs_enforcing())
		return real_cuMemCreate(handle, size, prop, flags);
	int device = 0;
	if (prop)
		memcpy(&device, (const char *)prop + 12, sizeof(device));
	if (hcs_alloc_begin(device, size) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = real_cuMemCreate(handle, size, prop, flags);
	hcs_alloc_end(rc == CUDA_SUCCESS, rc == CUDA_SUCCESS ? *handle : 0, HCS_KIND_VMM, device,
		      size);
	return rc;
}

CUresult hcs_cuMemRelease(CUmemGenericAllocationHandle handle)
{
	CUDA_FREE(cuMemRelease, HCS_KIND_VMM, handle, handle);
}

CUresult hcs_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
	ready();
	MISSING(cuMemGetInfo_v2);
	CUresult rc = real_cuMemGetInfo_v2(free_bytes, total_bytes);
	if (rc == CUDA_SUCCESS && hcs_cfg.enforcing)
		hcs_clamp_info(ordinal(), free_bytes, total_bytes);
	return rc;
}

/* Real entry -> our hook: whatever version the driver picked, we match by address. */
static void *swap_for_hook(void *function)
{
	pthread_once(&launch_once, resolve_launch);
	struct { void **real; void *hook; } table[] = {
		{(void **)&real_cuMemAlloc_v2, (void *)cuMemAlloc_v2},
		{(void **)&real_cuMemAllocPitch_v2, (void *)cuMemAllocPitch_v2},
		{(void **)&real_cuMemAllocManaged, (void *)cuMemAllocManaged},
		{(void **)&real_cuMemAllocAsync, (void *)cuMemAllocAsync},
		{(void **)&real_cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync},
		{(void **)&real_cuMemFree_v2, (void *)cuMemFree_v2},
		{(void **)&real_cuMemFreeAsync, (void *)cuMemFreeAsync},
		{(void **)&real_cuMemCreate, (void *)cuMemCreate},
		{(void **)&real_cuMemRelease, (void *)cuMemRelease},
		{(void **)&real_cuMemGetInfo_v2, (void *)cuMemGetInfo_v2},
		{(void **)&real_cuGetProcAddress, (void *)cuGetProcAddress},
		{(void **)&real_cuGetProcAddress_v2, (void *)cuGetProcAddress_v2},
		{(void **)&real_cuLaunchKernel, (void *)cuLaunchKernel},
		{(void **)&real_cuLaunchKernelEx, (void *)cuLaunchKernelEx},
		{(void **)&real_cuGraphLaunch, (void *)cuGraphLaunch},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (function && *table[i].real == function)
			return table[i].hook;
	return function;
}

CUresult hcs_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	ready();
	MISSING(cuGetProcAddress);
	CUresult rc = real_cuGetProcAddress(symbol, pfn, version, flags);
	if (rc == CUDA_SUCCESS && pfn)
		*pfn = swap_for_hook(*pfn);
	return rc;
}

CUresult hcs_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status)
{
	ready();
	MISSING(cuGetProcAddress_v2);
	CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
	if (rc == CUDA_SUCCESS && pfn)
		*pfn = swap_for_hook(*pfn);
	return rc;
}

/* Kernel launches: only devices with a compute share below 100% are measured and paced. */
void hcs_throttle(int device, int share);
int hcs_compute_share(int *device);
int hcs_pair_begin(int device, CUstream stream);
void hcs_pair_end(int index, CUstream stream);


#define PACED(name, stream, ...)                                                              \
	pthread_once(&launch_once, resolve_launch);                                          \
	MISSING(name);                                                                       \
	int device, share = hcs_compute_share(&device);                                      \
	if (!share)                                                                          \
		return real_##name(__VA_ARGS__);                                             \
	hcs_in_hook++;                                                                       \
	hcs_throttle(device, share);                                                         \
	int pair = hcs_pair_begin(device, stream);                                           \
	CUresult rc = real_##name(__VA_ARGS__);                                              \
	hcs_pair_end(pair, stream);                                                          \
	hcs_in_hook--;                                                                       \
	return rc

CUresult hcs_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			    CUstream stream, void **params, void **extra)
{
	PACED(cuLaunchKernel, stream, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

/* CUlaunchConfig: {unsigned gridDimX, Y, Z, blockDimX, Y, Z, sharedMemBytes; CUstream hStream;
 * ...}: the stream sits after seven unsigned ints, at offset 32 (8-byte aligned). */
CUresult hcs_cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra)
{
	CUstream stream = NULL;
	if (config)
		memcpy(&stream, (const char *)config + 32, sizeof(stream));
	PACED(cuLaunchKernelEx, stream, config, f, params, extra);
}

CUresult hcs_cuGraphLaunch(CUgraphExec graph, CUstream stream)
{
	PACED(cuGraphLaunch, stream, graph, stream);
}
