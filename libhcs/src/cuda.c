/* CUDA driver API: allocations (plain, pitched, managed, stream-ordered, pool), VMM physical
 * handles, frees, memory info, launches (paced by the compute share), and cuGetProcAddress
 * (cudart 12 resolves the driver through it, so its answers must be our hooks). The device
 * is the current context's. The rows are in symbols.h; only the irregular hooks are here. */
#include <string.h>

#include "backend.h"
#include "hooks.h"
#include "limiter.h"

static const char *const cuda_libraries[] = {"libcuda.so.1", "libcuda.so", NULL};
#define HCS_OK_cuda CUDA_SUCCESS
#define HCS_OOM_cuda CUDA_ERROR_OUT_OF_MEMORY
#define HCS_MISSING_cuda CUDA_ERROR_NOT_FOUND
#define CUDA_HELPERS(Y) Y(cuda, CUresult, cuCtxGetDevice, (CUdevice *device))

HCS_BACKEND(cuda, HCS_SYMBOLS_cuda, CUDA_HELPERS)

static inline int cuda_ordinal(void)
{
	CUdevice device = 0;
	if (real_cuCtxGetDevice && real_cuCtxGetDevice(&device) == CUDA_SUCCESS)
		return device;
	return 0;
}

HCS_SYMBOLS_cuda(HCS_DEFINE_HOOK)

/* The pitch is chosen by the driver: reserve width x height first, the rest once known. */
CUresult hcs_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
				unsigned int element_size)
{
	cuda_ready();
	if (!real_cuMemAllocPitch_v2)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing())
		return real_cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
	int device = cuda_ordinal();
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

/* The device a VMM or pool location charges, or -1 for host memory (host, host-NUMA,
 * host-NUMA-current: never charged). A type this library does not know is charged to the
 * current device: the driver refuses it, or it is memory we must not miss. */
static int location_device(const CUmemLocation *location)
{
	switch (location->type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		return location->id;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
		return -1;
	default:
		return cuda_ordinal();
	}
}

CUresult hcs_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	cuda_ready();
	if (!real_cuMemCreate)
		return CUDA_ERROR_NOT_FOUND;
	int device = prop ? location_device(&prop->location) : cuda_ordinal();
	if (!hcs_enforcing() || device < 0)
		return real_cuMemCreate(handle, size, prop, flags);
	HCS_ALLOC_ON(cuda, cuMemCreate, (handle, size, prop, flags), HCS_KIND_VMM, *handle, size,
		     device);
}

/* Pools are remembered with their location, so that allocations from them are charged where
 * they land; a pool we never saw created is taken to be the current device's. */
static void remember_pool(CUmemoryPool pool, int device)
{
	if (hcs_cfg.enforcing && pool)
		hcs_track((uint64_t)(uintptr_t)pool, HCS_KIND_POOL, device, 0);
}

CUresult hcs_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	cuda_ready();
	if (!real_cuMemPoolCreate)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuMemPoolCreate(pool, props);
	if (rc == CUDA_SUCCESS && props)
		remember_pool(*pool, location_device(&props->location));
	return rc;
}

CUresult hcs_cuMemPoolDestroy(CUmemoryPool pool)
{
	cuda_ready();
	if (!real_cuMemPoolDestroy)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuMemPoolDestroy(pool);
	int device;
	uint64_t unused;
	if (rc == CUDA_SUCCESS && hcs_cfg.enforcing)
		hcs_untrack((uint64_t)(uintptr_t)pool, HCS_KIND_POOL, &device, &unused);
	return rc;
}

CUresult hcs_cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	cuda_ready();
	if (!real_cuDeviceGetDefaultMemPool)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuDeviceGetDefaultMemPool(pool, dev);
	if (rc == CUDA_SUCCESS)
		remember_pool(*pool, dev);
	return rc;
}

CUresult hcs_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	cuda_ready();
	if (!real_cuDeviceGetMemPool)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuDeviceGetMemPool(pool, dev);
	if (rc == CUDA_SUCCESS)
		remember_pool(*pool, dev);
	return rc;
}

static int pool_device(CUmemoryPool pool)
{
	int device;
	uint64_t unused;
	if (pool && hcs_lookup((uint64_t)(uintptr_t)pool, HCS_KIND_POOL, &device, &unused))
		return device;
	return cuda_ordinal();
}

CUresult hcs_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
				     CUstream stream)
{
	cuda_ready();
	if (!real_cuMemAllocFromPoolAsync)
		return CUDA_ERROR_NOT_FOUND;
	int device = hcs_enforcing() ? pool_device(pool) : -1;
	if (device < 0)
		return real_cuMemAllocFromPoolAsync(dptr, size, pool, stream);
	HCS_ALLOC_ON(cuda, cuMemAllocFromPoolAsync, (dptr, size, pool, stream), HCS_KIND_PTR,
		     *dptr, size, device);
}

/* Real entry -> our hook: whatever version the driver picked, we match by address. */
#define SWAP_ENTRY(v, ret, name, ...) {(void **)&real_##name, (void *)name},
static void *swap_for_hook(void *function)
{
	const struct { void **real; void *hook; } table[] = {HCS_SYMBOLS_cuda(SWAP_ENTRY)};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (function && *table[i].real == function)
			return table[i].hook;
	return function;
}

CUresult hcs_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	cuda_ready();
	if (!real_cuGetProcAddress)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuGetProcAddress(symbol, pfn, version, flags);
	if (rc == CUDA_SUCCESS && pfn)
		*pfn = swap_for_hook(*pfn);
	return rc;
}

CUresult hcs_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status)
{
	cuda_ready();
	if (!real_cuGetProcAddress_v2)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
	if (rc == CUDA_SUCCESS && pfn)
		*pfn = swap_for_hook(*pfn);
	return rc;
}

/* CUlaunchConfig: {unsigned gridDimX, Y, Z, blockDimX, Y, Z, sharedMemBytes; CUstream hStream;
 * ...}: the stream sits after seven unsigned ints, at offset 32 (8-byte aligned). */
CUresult hcs_cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra)
{
	CUstream stream = NULL;
	if (config)
		memcpy(&stream, (const char *)config + 32, sizeof(stream));
	HCS_LAUNCH_BRACKET(cuda, cuLaunchKernelEx, (config, f, params, extra), stream);
}
