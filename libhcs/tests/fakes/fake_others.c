/* Fake HIP, ACL, Ascend runtime, CNRT and CNDrv libraries; each is built from this file as
 * its own shared object (-DFAKE_HIP, -DFAKE_ACL, …) with the vendor's names and codes. */
#include "../../include/hcs_abi.h"
#include "fake_memory.h"

#define ALLOC(ptr, size, oom) \
	uint64_t key; if (fake_alloc(size, 0, &key)) return oom; \
	*(ptr) = (void *)(uintptr_t)key; return 0
#define INFO(f, t) fake_info(f, t); return 0

FAKE_API void fakeSetDevice(int device) { fake_current_device = device; }

#ifdef FAKE_HIP
FAKE_API hipError_t hipGetDevice(int *d) { *d = fake_current_device; return 0; }
FAKE_API hipError_t hipMalloc(void **p, size_t s) { ALLOC(p, s, hipErrorOutOfMemory); }
FAKE_API hipError_t hipMallocManaged(void **p, size_t s, unsigned int f) { (void)f; ALLOC(p, s, hipErrorOutOfMemory); }
FAKE_API hipError_t hipMallocAsync(void **p, size_t s, hipStream_t st) { (void)st; ALLOC(p, s, hipErrorOutOfMemory); }
FAKE_API hipError_t hipExtMallocWithFlags(void **p, size_t s, unsigned int f) { (void)f; ALLOC(p, s, hipErrorOutOfMemory); }
FAKE_API hipError_t hipFree(void *p) { return fake_free((uint64_t)(uintptr_t)p, 0) ? 1 : 0; }
FAKE_API hipError_t hipFreeAsync(void *p, hipStream_t st) { (void)st; return hipFree(p); }
FAKE_API hipError_t hipMemGetInfo(size_t *f, size_t *t) { INFO(f, t); }
#endif

#ifdef FAKE_ACL
FAKE_API aclError aclrtGetDevice(int32_t *d) { *d = fake_current_device; return 0; }
FAKE_API aclError aclrtMalloc(void **p, size_t s, aclrtMemMallocPolicy pol) { (void)pol; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API aclError aclrtFree(void *p) { return fake_free((uint64_t)(uintptr_t)p, 0) ? 100000 : 0; }
FAKE_API aclError aclrtGetMemInfo(aclrtMemAttr a, size_t *f, size_t *t) { (void)a; INFO(f, t); }
#endif

#ifdef FAKE_RT
FAKE_API rtError_t rtGetDevice(int32_t *d) { *d = fake_current_device; return 0; }
FAKE_API rtError_t rtMalloc(void **p, uint64_t s, int type, uint16_t module) { (void)type; (void)module; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API rtError_t rtFree(void *p) { return fake_free((uint64_t)(uintptr_t)p, 0) ? 107000 : 0; }
FAKE_API rtError_t rtMallocPhysical(rtDrvMemHandle_t *h, size_t s, void *prop, uint64_t f)
{
	(void)prop; (void)f;
	uint64_t key;
	if (fake_alloc(s, 1, &key)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
	*h = (rtDrvMemHandle_t)(uintptr_t)key;
	return 0;
}
FAKE_API rtError_t rtFreePhysical(rtDrvMemHandle_t h) { return fake_free((uint64_t)(uintptr_t)h, 1) ? 107000 : 0; }
FAKE_API rtError_t rtMemGetInfoEx(rtMemInfoType_t type, size_t *f, size_t *t) { (void)type; INFO(f, t); }
#endif

#ifdef FAKE_CNRT
FAKE_API cnrtRet_t cnrtGetDevice(int *d) { *d = fake_current_device; return 0; }
FAKE_API cnrtRet_t cnrtMalloc(void **p, size_t s) { ALLOC(p, s, CNRT_RET_ERR_NOMEM); }
FAKE_API cnrtRet_t cnrtFree(void *p) { return fake_free((uint64_t)(uintptr_t)p, 0) ? 632007 : 0; }
FAKE_API cnrtRet_t cnrtMemGetInfo(size_t *f, size_t *t) { INFO(f, t); }
#endif

#ifdef FAKE_CNDRV
FAKE_API CNresult cnCtxGetDevice(int *d) { *d = fake_current_device; return 0; }
FAKE_API CNresult cnMalloc(CNaddr *p, uint64_t s)
{
	uint64_t key;
	if (fake_alloc(s, 0, &key)) return CN_MEMORY_ERROR_OUT_OF_MEMORY;
	*p = key;
	return 0;
}
FAKE_API CNresult cnFree(CNaddr p) { return fake_free(p, 0) ? 1 : 0; }
#endif
