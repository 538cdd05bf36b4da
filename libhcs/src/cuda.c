/* CUDA driver API memory: allocations (plain, pitched, managed, stream-ordered, pool), VMM
 * physical handles (created or imported), frees, memory info, and cuGetProcAddress (cudart
 * resolves the driver through it, so its answers must be our hooks). The device is the current
 * context's unless the call names a location. Rows in symbols.h; the irregular hooks here. */
#include "cuda.h"

#define MEMORY_HELPERS(Y)                                                                    \
	HCS_CUDA_HELPERS(Y)                                                                  \
	Y(cuda, CUresult, cuMemGetAllocationPropertiesFromHandle,                            \
	  (CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle))

HCS_CUDA_BACKEND(HCS_SYMBOLS_cuda_memory, MEMORY_HELPERS)
HCS_SYMBOLS_cuda_memory(HCS_DEFINE_HOOK)
static HCS_CUDA_SWAP(memory_swap, HCS_SYMBOLS_cuda_memory)

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
	if (rc != CUDA_SUCCESS) {
		hcs_alloc_end(false, 0, HCS_KIND_PTR, device, estimate);
		return rc;
	}
	uint64_t actual = (uint64_t)*pitch * height;
	if (!hcs_settle(device, estimate, actual)) {
		real_cuMemFree_v2(*dptr);
		hcs_alloc_end(false, 0, HCS_KIND_PTR, device, estimate);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	hcs_alloc_end(true, *dptr, HCS_KIND_PTR, device, actual);
	return rc;
}

CUresult hcs_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	cuda_ready();
	if (!real_cuMemCreate)
		return CUDA_ERROR_NOT_FOUND;
	int device = prop ? HCS_CUDA_LOCATION_DEVICE(&prop->location) : cuda_ordinal();
	if (!hcs_enforcing() || device < 0)
		return real_cuMemCreate(handle, size, prop, flags);
	HCS_ALLOC_ON(cuda, cuMemCreate, (handle, size, prop, flags), HCS_KIND_VMM, *handle, size,
		     device);
}

/* An imported handle (another process exported it) keeps the memory alive after its creator
 * releases it, so the importer is charged: what its mappings cover, from the first cuMemMap
 * (the import itself does not say the size), until it releases the handle. */
CUresult hcs_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
					    CUmemAllocationHandleType type)
{
	cuda_ready();
	if (!real_cuMemImportFromShareableHandle)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuMemImportFromShareableHandle(handle, os_handle, type);
	if (rc != CUDA_SUCCESS || !hcs_enforcing())
		return rc;
	CUmemAllocationProp prop;
	int device = cuda_ordinal();
	if (real_cuMemGetAllocationPropertiesFromHandle &&
	    real_cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS)
		device = HCS_CUDA_LOCATION_DEVICE(&prop.location);
	if (device >= 0)
		hcs_track(*handle, HCS_KIND_IMPORT, device, 0);
	return rc;
}

CUresult hcs_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	cuda_ready();
	if (!real_cuMemMap)
		return CUDA_ERROR_NOT_FOUND;
	int device;
	uint64_t charged;
	if (!hcs_enforcing() || !hcs_lookup(handle, HCS_KIND_IMPORT, &device, &charged))
		return real_cuMemMap(ptr, size, offset, handle, flags);
	uint64_t extent = (uint64_t)offset + size;
	if (extent < offset || extent <= charged)
		return real_cuMemMap(ptr, size, offset, handle, flags);
	if (hcs_alloc_begin(device, extent - charged) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = real_cuMemMap(ptr, size, offset, handle, flags);
	if (rc == CUDA_SUCCESS)
		hcs_track(handle, HCS_KIND_IMPORT, device, extent);
	else
		hcs_unreserve(device, extent - charged);
	hcs_in_hook--;
	return rc;
}

CUresult hcs_cuMemRelease(CUmemGenericAllocationHandle handle)
{
	cuda_ready();
	if (!real_cuMemRelease)
		return CUDA_ERROR_NOT_FOUND;
	int device = 0, kind = 0;
	uint64_t size = 0;
	hcs_in_hook++;
	bool tracked = hcs_untrack_either(handle, HCS_KIND_VMM, HCS_KIND_IMPORT, &kind, &device,
					  &size);
	CUresult rc = real_cuMemRelease(handle);
	hcs_free_end(tracked, rc == CUDA_SUCCESS, handle, kind, device, size);
	return rc;
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
		remember_pool(*pool, HCS_CUDA_LOCATION_DEVICE(&props->location));
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

#define POOL_ALLOC(name)                                                                     \
	cuda_ready();                                                                        \
	if (!real_##name)                                                                    \
		return CUDA_ERROR_NOT_FOUND;                                                 \
	int device = hcs_enforcing() ? pool_device(pool) : -1;                               \
	if (device < 0)                                                                      \
		return real_##name(dptr, size, pool, stream);                                \
	HCS_ALLOC_ON(cuda, name, (dptr, size, pool, stream), HCS_KIND_PTR, *dptr, size, device)

CUresult hcs_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
				     CUstream stream)
{
	POOL_ALLOC(cuMemAllocFromPoolAsync);
}

CUresult hcs_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
					  CUstream stream)
{
	POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz);
}

/* Real entry -> our hook: whatever version (or per-thread variant) the driver picked. */
static void *swap_for_hook(void *function)
{
	void *hook = memory_swap(function);
	if (!hook)
		hook = hcs_cuda_array_swap(function);
	if (!hook)
		hook = hcs_cuda_graph_swap(function);
	if (!hook)
		hook = hcs_cuda_launch_swap(function);
	return hook ? hook : function;
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
