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
FAKE_API hipError_t hipMallocFromPoolAsync(void **p, size_t s, hipMemPool_t pool, hipStream_t st)
{ (void)pool; (void)st; ALLOC(p, s, hipErrorOutOfMemory); }
/* Pitched: rows padded to 512 bytes, as the driver picks. */
FAKE_API hipError_t hipMallocPitch(void **p, size_t *pitch, size_t w, size_t h)
{
	*pitch = (w + 511) & ~(size_t)511;
	ALLOC(p, *pitch * h, hipErrorOutOfMemory);
}
FAKE_API hipError_t hipMemAllocPitch(hipDeviceptr_t *p, size_t *pitch, size_t w, size_t h,
				     unsigned int e)
{
	(void)e;
	return hipMallocPitch(p, pitch, w, h);
}
FAKE_API hipError_t hipMalloc3D(hipPitchedPtr *pp, hipExtent e)
{
	size_t pitch = (e.width + 511) & ~(size_t)511, rows = e.height * (e.depth ? e.depth : 1);
	uint64_t key;
	if (fake_alloc(pitch * rows, 0, &key))
		return hipErrorOutOfMemory;
	*pp = (hipPitchedPtr){(void *)(uintptr_t)key, pitch, e.width, e.height};
	return 0;
}
/* Arrays as handles of width x height x depth elements. */
static hipError_t fake_array(hipArray_t *a, uint64_t bytes)
{
	uint64_t key;
	if (fake_alloc(bytes, 1, &key))
		return hipErrorOutOfMemory;
	*a = (hipArray_t)(uintptr_t)key;
	return 0;
}
static uint64_t desc_bytes(const hipChannelFormatDesc *d)
{
	return (uint64_t)(d->x + d->y + d->z + d->w) / 8;
}
FAKE_API hipError_t hipMallocArray(hipArray_t *a, const hipChannelFormatDesc *d, size_t w,
				   size_t h, unsigned int fl)
{
	(void)fl;
	return fake_array(a, desc_bytes(d) * w * (h ? h : 1));
}
FAKE_API hipError_t hipMalloc3DArray(hipArray_t *a, const hipChannelFormatDesc *d, hipExtent e,
				     unsigned int fl)
{
	(void)fl;
	return fake_array(a, desc_bytes(d) * e.width * (e.height ? e.height : 1) *
				     (e.depth ? e.depth : 1));
}
static uint64_t format_bytes(int format) { return format == 0x20 ? 4 : format == 0x10 ? 2 : 1; }
FAKE_API hipError_t hipArrayCreate(hipArray_t *a, const HIP_ARRAY_DESCRIPTOR *d)
{
	return fake_array(a, format_bytes(d->Format) * d->NumChannels * d->Width *
				     (d->Height ? d->Height : 1));
}
FAKE_API hipError_t hipArray3DCreate(hipArray_t *a, const HIP_ARRAY3D_DESCRIPTOR *d)
{
	return fake_array(a, format_bytes(d->Format) * d->NumChannels * d->Width *
				     (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1));
}
FAKE_API hipError_t hipFreeArray(hipArray_t a) { return fake_free((uint64_t)(uintptr_t)a, 1) ? 1 : 0; }
FAKE_API hipError_t hipArrayDestroy(hipArray_t a) { return hipFreeArray(a); }
/* VMM: host locations are host memory. */
FAKE_API hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *h, size_t s,
				 const hipMemAllocationProp *prop, unsigned long long fl)
{
	(void)fl;
	int type = prop ? prop->location.type : 0;
	int device = type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id
		   : type >= CU_MEM_LOCATION_TYPE_HOST && type <= CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
			   ? -1
			   : -2;
	uint64_t key;
	if (device < -1)
		return 1; /* hipErrorInvalidValue */
	if (fake_alloc_on(device, s, 1, &key))
		return hipErrorOutOfMemory;
	*h = (hipMemGenericAllocationHandle_t)(uintptr_t)key;
	return 0;
}
FAKE_API hipError_t hipMemRelease(hipMemGenericAllocationHandle_t h)
{
	return fake_free((uint64_t)(uintptr_t)h, 1) ? 1 : 0;
}
#endif

#ifdef FAKE_ACL
FAKE_API aclError aclrtGetDevice(int32_t *d) { *d = fake_current_device; return 0; }
FAKE_API aclError aclrtMalloc(void **p, size_t s, aclrtMemMallocPolicy pol) { (void)pol; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API aclError aclrtFree(void *p) { return fake_free((uint64_t)(uintptr_t)p, 0) ? 100000 : 0; }
FAKE_API aclError aclrtGetMemInfo(aclrtMemAttr a, size_t *f, size_t *t) { (void)a; INFO(f, t); }
FAKE_API aclError aclrtMallocAlign32(void **p, size_t s, aclrtMemMallocPolicy pol) { (void)pol; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API aclError aclrtMallocCached(void **p, size_t s, aclrtMemMallocPolicy pol) { (void)pol; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API aclError aclrtMallocWithCfg(void **p, size_t s, aclrtMemMallocPolicy pol, aclrtMallocConfig *cfg)
{ (void)pol; (void)cfg; ALLOC(p, s, ACL_ERROR_RT_MEMORY_ALLOCATION); }
FAKE_API aclError aclrtFreeWithDevSync(void *p) { return aclrtFree(p); }
FAKE_API aclError aclrtMallocPhysical(aclrtDrvMemHandle *h, size_t s, const aclrtPhysicalMemProp *prop,
				      uint64_t fl)
{
	(void)fl;
	int device = !prop ? -2 : prop->location.type == ACL_MEM_LOCATION_TYPE_HOST ? -1
		   : prop->location.type == ACL_MEM_LOCATION_TYPE_DEVICE ? (int)prop->location.id : -2;
	uint64_t key;
	if (device < -1)
		return 100000;
	if (fake_alloc_on(device, s, 1, &key))
		return ACL_ERROR_RT_MEMORY_ALLOCATION;
	*h = (aclrtDrvMemHandle)(uintptr_t)key;
	return 0;
}
FAKE_API aclError aclrtFreePhysical(aclrtDrvMemHandle h) { return fake_free((uint64_t)(uintptr_t)h, 1) ? 100000 : 0; }
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
FAKE_API cnrtRet_t cnrtMallocPeerAble(void **p, size_t s) { ALLOC(p, s, CNRT_RET_ERR_NOMEM); }
FAKE_API cnrtRet_t cnrtMallocFrameBuffer(void **p, size_t s) { ALLOC(p, s, CNRT_RET_ERR_NOMEM); }
FAKE_API cnrtRet_t cnrtFreeArray(void **p, int n)
{
	cnrtRet_t rc = 0;
	for (int i = 0; i < n; i++)
		if (fake_free((uint64_t)(uintptr_t)p[i], 0))
			rc = 632007;
	return rc;
}
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
FAKE_API CNresult cnZmalloc(CNaddr *p, uint64_t s) { return cnMalloc(p, s); }
FAKE_API CNresult cnMallocConstant(CNaddr *p, uint64_t s) { return cnMalloc(p, s); }
FAKE_API CNresult cnMallocSecurity(CNaddr *p, uint64_t s) { return cnMalloc(p, s); }
FAKE_API CNresult cnMallocPeerAble(CNaddr *p, uint64_t s) { return cnMalloc(p, s); }
#endif
