/* A fake libcuda.so.1 following the driver ABI for the calls libhcs hooks, plus
 * cuCtxGetDevice/cuCtxSetCurrent-style device selection (fakeSetDevice) and
 * cuGetProcAddress with the driver's versioned-name resolution. */
#include <string.h>

#include "../../include/hcs_abi.h"
#include "fake_memory.h"

FAKE_API void fakeSetDevice(int device) { fake_current_device = device; }
FAKE_API CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
FAKE_API CUresult cuCtxGetDevice(CUdevice *device) { *device = fake_current_device; return 0; }

#define ALLOC_OR_OOM(ptr, size) \
	uint64_t key; if (fake_alloc(size, 0, &key)) return CUDA_ERROR_OUT_OF_MEMORY; \
	*(ptr) = key; return CUDA_SUCCESS

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t s) { ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t s, unsigned int f) { (void)f; ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t s, CUstream st) { (void)st; ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t s, CUmemoryPool pool, CUstream st)
{ (void)pool; (void)st; ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
	(void)e;
	*pitch = (w + 511) & ~(size_t)511;
	ALLOC_OR_OOM(p, *pitch * h);
}
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p, 0) ? CUDA_ERROR_INVALID_VALUE : 0; }
FAKE_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream st) { (void)st; return cuMemFree_v2(p); }
FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t s, const void *prop,
			      unsigned long long f)
{
	(void)prop; (void)f;
	uint64_t key;
	if (fake_alloc(s, 1, &key)) return CUDA_ERROR_OUT_OF_MEMORY;
	*h = key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fake_free(h, 1) ? CUDA_ERROR_INVALID_VALUE : 0; }
FAKE_API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { fake_info(f, t); return CUDA_SUCCESS; }

/* The driver appends _v2 to names whose ABI changed when the version asks for it. */
FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	(void)flags;
	static const struct { const char *name; void *v1; void *v2; } table[] = {
		{"cuMemAlloc", NULL, (void *)cuMemAlloc_v2},
		{"cuMemAllocPitch", NULL, (void *)cuMemAllocPitch_v2},
		{"cuMemFree", NULL, (void *)cuMemFree_v2},
		{"cuMemGetInfo", NULL, (void *)cuMemGetInfo_v2},
		{"cuMemAllocManaged", (void *)cuMemAllocManaged, NULL},
		{"cuMemAllocAsync", (void *)cuMemAllocAsync, NULL},
		{"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, NULL},
		{"cuMemFreeAsync", (void *)cuMemFreeAsync, NULL},
		{"cuMemCreate", (void *)cuMemCreate, NULL},
		{"cuMemRelease", (void *)cuMemRelease, NULL},
		{"cuCtxGetDevice", (void *)cuCtxGetDevice, NULL},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].name, symbol) == 0) {
			*pfn = (version >= 3020 && table[i].v2) ? table[i].v2 : table[i].v1;
			return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
		}
	*pfn = NULL;
	return CUDA_ERROR_NOT_FOUND;
}
FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
				      cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	CUresult rc = cuGetProcAddress(symbol, pfn, version, flags);
	if (status) *status = rc == CUDA_SUCCESS ? 0 : 1;
	return rc;
}
