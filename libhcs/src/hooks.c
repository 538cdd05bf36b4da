/* The exported symbols: each forwards to the internal hcs_* function of its vendor backend.
 * Only these and dlsym leave the library (libhcs.map); everything else is hidden. */
#include <string.h>

#include "hooks.h"
#include "internal.h"

#define FORWARD(ret, name, params, args)                                                     \
	ret hcs_##name params;                                                               \
	HCS_API ret name params { return hcs_##name args; }

FORWARD(CUresult, cuMemAlloc_v2, (CUdeviceptr *p, size_t s), (p, s))
FORWARD(CUresult, cuMemAllocPitch_v2,
	(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e), (p, pitch, w, h, e))
FORWARD(CUresult, cuMemAllocManaged, (CUdeviceptr *p, size_t s, unsigned int f), (p, s, f))
FORWARD(CUresult, cuMemAllocAsync, (CUdeviceptr *p, size_t s, CUstream st), (p, s, st))
FORWARD(CUresult, cuMemAllocFromPoolAsync,
	(CUdeviceptr *p, size_t s, CUmemoryPool pool, CUstream st), (p, s, pool, st))
FORWARD(CUresult, cuMemFree_v2, (CUdeviceptr p), (p))
FORWARD(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream st), (p, st))
FORWARD(CUresult, cuMemCreate,
	(CUmemGenericAllocationHandle *h, size_t s, const void *prop, unsigned long long f),
	(h, s, prop, f))
FORWARD(CUresult, cuMemRelease, (CUmemGenericAllocationHandle h), (h))
FORWARD(CUresult, cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
FORWARD(CUresult, cuGetProcAddress, (const char *s, void **pfn, int v, cuuint64_t f),
	(s, pfn, v, f))
FORWARD(CUresult, cuGetProcAddress_v2,
	(const char *s, void **pfn, int v, cuuint64_t f, CUdriverProcAddressQueryResult *st),
	(s, pfn, v, f, st))
FORWARD(CUresult, cuLaunchKernel,
	(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
	 unsigned int by, unsigned int bz, unsigned int sh, CUstream st, void **p, void **e),
	(f, gx, gy, gz, bx, by, bz, sh, st, p, e))
FORWARD(CUresult, cuLaunchKernelEx, (const void *c, CUfunction f, void **p, void **e),
	(c, f, p, e))
FORWARD(CUresult, cuGraphLaunch, (CUgraphExec g, CUstream st), (g, st))
FORWARD(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t d, nvmlMemory_t *m), (d, m))
FORWARD(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t d, nvmlMemory_v2_t *m), (d, m))
FORWARD(hipError_t, hipMalloc, (void **p, size_t s), (p, s))
FORWARD(hipError_t, hipMallocManaged, (void **p, size_t s, unsigned int f), (p, s, f))
FORWARD(hipError_t, hipMallocAsync, (void **p, size_t s, hipStream_t st), (p, s, st))
FORWARD(hipError_t, hipExtMallocWithFlags, (void **p, size_t s, unsigned int f), (p, s, f))
FORWARD(hipError_t, hipFree, (void *p), (p))
FORWARD(hipError_t, hipFreeAsync, (void *p, hipStream_t st), (p, st))
FORWARD(hipError_t, hipMemGetInfo, (size_t *f, size_t *t), (f, t))
FORWARD(aclError, aclrtMalloc, (void **p, size_t s, aclrtMemMallocPolicy pol), (p, s, pol))
FORWARD(aclError, aclrtFree, (void *p), (p))
FORWARD(aclError, aclrtGetMemInfo, (aclrtMemAttr a, size_t *f, size_t *t), (a, f, t))
FORWARD(rtError_t, rtMalloc, (void **p, uint64_t s, int type, uint16_t module), (p, s, type, module))
FORWARD(rtError_t, rtFree, (void *p), (p))
FORWARD(rtError_t, rtMallocPhysical, (rtDrvMemHandle_t *h, size_t s, void *prop, uint64_t f),
	(h, s, prop, f))
FORWARD(rtError_t, rtFreePhysical, (rtDrvMemHandle_t h), (h))
FORWARD(rtError_t, rtMemGetInfoEx, (rtMemInfoType_t t, size_t *f, size_t *tt), (t, f, tt))
FORWARD(cnrtRet_t, cnrtMalloc, (void **p, size_t s), (p, s))
FORWARD(cnrtRet_t, cnrtFree, (void *p), (p))
FORWARD(cnrtRet_t, cnrtMemGetInfo, (size_t *f, size_t *t), (f, t))
FORWARD(CNresult, cnMalloc, (CNaddr *p, uint64_t s), (p, s))
FORWARD(CNresult, cnFree, (CNaddr p), (p))

#define ENTRY(name) {#name, (void *)name}
static const struct { const char *name; void *hook; } hooks[] = {
	ENTRY(cuMemAlloc_v2), ENTRY(cuMemAllocPitch_v2), ENTRY(cuMemAllocManaged),
	ENTRY(cuMemAllocAsync), ENTRY(cuMemAllocFromPoolAsync), ENTRY(cuMemFree_v2),
	ENTRY(cuMemFreeAsync), ENTRY(cuMemCreate), ENTRY(cuMemRelease), ENTRY(cuMemGetInfo_v2),
	ENTRY(cuGetProcAddress), ENTRY(cuGetProcAddress_v2), ENTRY(cuLaunchKernel),
	ENTRY(cuLaunchKernelEx), ENTRY(cuGraphLaunch), ENTRY(nvmlDeviceGetMemoryInfo),
	ENTRY(nvmlDeviceGetMemoryInfo_v2), ENTRY(hipMalloc), ENTRY(hipMallocManaged),
	ENTRY(hipMallocAsync), ENTRY(hipExtMallocWithFlags), ENTRY(hipFree), ENTRY(hipFreeAsync),
	ENTRY(hipMemGetInfo), ENTRY(aclrtMalloc), ENTRY(aclrtFree), ENTRY(aclrtGetMemInfo),
	ENTRY(rtMalloc), ENTRY(rtFree), ENTRY(rtMallocPhysical), ENTRY(rtFreePhysical),
	ENTRY(rtMemGetInfoEx), ENTRY(cnrtMalloc), ENTRY(cnrtFree), ENTRY(cnrtMemGetInfo),
	ENTRY(cnMalloc), ENTRY(cnFree),
};

/* Called by the dlsym trampoline: our hook for a hooked name, else NULL (forward). */
void *hcs_dlsym_hook_for(const char *symbol)
{
	if (!hcs_dlsym_ready() || !symbol || !hcs_cfg.enforcing || hcs_in_hook)
		return NULL;
	for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
		if (strcmp(hooks[i].name, symbol) == 0)
			return hooks[i].hook;
	return NULL;
}
