/* The other vendors' allocation calls beside the plain malloc, checked against their headers:
 * HIP pools, pitched and 3D allocations, arrays and VMM (host locations uncharged); ACL's
 * aligned, cached, configured and physical allocations; CNRT's peer-able and frame-buffer
 * allocations and batch free; CNDrv's other allocators. Each is limited and credited exactly.
 * Through dlopen, as frameworks reach them. Run with HCS_VRAM_QUOTA=1Gi. */
#include <dlfcn.h>
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"

#define SYM(lib, name) __typeof__(name) *name##_ = (__typeof__(name) *)dlsym(lib, #name)

/* Prototypes as the vendors' headers give them (resolved through dlsym, never linked). */
hipError_t hipMemGetInfo(size_t *, size_t *);
hipError_t hipFree(void *);
hipError_t hipMallocFromPoolAsync(void **, size_t, hipMemPool_t, hipStream_t);
hipError_t hipMallocPitch(void **, size_t *, size_t, size_t);
hipError_t hipMemAllocPitch(hipDeviceptr_t *, size_t *, size_t, size_t, unsigned int);
hipError_t hipMalloc3D(hipPitchedPtr *, hipExtent);
hipError_t hipMallocArray(hipArray_t *, const hipChannelFormatDesc *, size_t, size_t, unsigned int);
hipError_t hipMalloc3DArray(hipArray_t *, const hipChannelFormatDesc *, hipExtent, unsigned int);
hipError_t hipArrayCreate(hipArray_t *, const HIP_ARRAY_DESCRIPTOR *);
hipError_t hipArray3DCreate(hipArray_t *, const HIP_ARRAY3D_DESCRIPTOR *);
hipError_t hipFreeArray(hipArray_t);
hipError_t hipArrayDestroy(hipArray_t);
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *, size_t, const hipMemAllocationProp *,
			unsigned long long);
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t);
aclError aclrtGetMemInfo(aclrtMemAttr, size_t *, size_t *);
aclError aclrtMallocAlign32(void **, size_t, aclrtMemMallocPolicy);
aclError aclrtMallocCached(void **, size_t, aclrtMemMallocPolicy);
aclError aclrtMallocWithCfg(void **, size_t, aclrtMemMallocPolicy, aclrtMallocConfig *);
aclError aclrtFree(void *);
aclError aclrtFreeWithDevSync(void *);
aclError aclrtMallocPhysical(aclrtDrvMemHandle *, size_t, const aclrtPhysicalMemProp *, uint64_t);
aclError aclrtFreePhysical(aclrtDrvMemHandle);
cnrtRet_t cnrtMemGetInfo(size_t *, size_t *);
cnrtRet_t cnrtMallocPeerAble(void **, size_t);
cnrtRet_t cnrtMallocFrameBuffer(void **, size_t);
cnrtRet_t cnrtFreeArray(void **, int);
CNresult cnZmalloc(CNaddr *, uint64_t);
CNresult cnMallocConstant(CNaddr *, uint64_t);
CNresult cnMallocSecurity(CNaddr *, uint64_t);
CNresult cnMallocPeerAble(CNaddr *, uint64_t);
CNresult cnFree(CNaddr);

static void hip(void)
{
	void *lib = dlopen("libamdhip64.so", RTLD_NOW);
	CHECK(lib != NULL, "libamdhip64.so");
	if (!lib)
		return;
	SYM(lib, hipMemGetInfo); SYM(lib, hipFree); SYM(lib, hipMallocFromPoolAsync);
	SYM(lib, hipMallocPitch); SYM(lib, hipMemAllocPitch); SYM(lib, hipMalloc3D);
	SYM(lib, hipMallocArray); SYM(lib, hipMalloc3DArray); SYM(lib, hipArrayCreate);
	SYM(lib, hipArray3DCreate); SYM(lib, hipFreeArray); SYM(lib, hipArrayDestroy);
	SYM(lib, hipMemCreate); SYM(lib, hipMemRelease);
	size_t f = 0, t = 0, pitch = 0;
#define FREE_NOW() (hipMemGetInfo_(&f, &t), f)
	void *a = NULL, *b = NULL;
	CHECK(hipMallocFromPoolAsync_(&a, 700 * MiB, NULL, NULL) == 0 &&
	      hipMallocFromPoolAsync_(&b, 700 * MiB, NULL, NULL) == hipErrorOutOfMemory,
	      "hipMallocFromPoolAsync limited");
	CHECK(hipFree_(a) == 0 && FREE_NOW() == GiB, "credited");
	CHECK(hipMallocPitch_(&a, &pitch, 1000, 400 * 1024) == 0 && pitch == 1024 &&
	      FREE_NOW() == GiB - 400 * MiB, "hipMallocPitch charged at pitch x height: %zu", f);
	CHECK(hipMemAllocPitch_(&b, &pitch, 1000, 700 * 1024, 4) == hipErrorOutOfMemory,
	      "hipMemAllocPitch limited");
	hipPitchedPtr pp;
	CHECK(hipMalloc3D_(&pp, (hipExtent){1000, 1024, 500}) == 0 &&
	      FREE_NOW() == GiB - 900 * MiB, "hipMalloc3D charged at pitch x height x depth");
	CHECK(hipFree_(a) == 0 && hipFree_(pp.ptr) == 0 && FREE_NOW() == GiB, "credited");

	hipArray_t x = NULL, y = NULL, z = NULL, w = NULL;
	hipChannelFormatDesc float4 = {32, 32, 32, 32, 2};
	HIP_ARRAY_DESCRIPTOR d2 = {8192, 4096, 0x20, 1};          /* 128Mi */
	HIP_ARRAY3D_DESCRIPTOR d3 = {1024, 1024, 128, 0x01, 1, 0}; /* 128Mi */
	CHECK(hipMallocArray_(&x, &float4, 4096, 4096, 0) == 0 && FREE_NOW() <= GiB - 256 * MiB,
	      "hipMallocArray charged: free %zu", f);
	CHECK(hipMalloc3DArray_(&y, &float4, (hipExtent){2048, 2048, 16}, 0) == hipErrorOutOfMemory,
	      "hipMalloc3DArray past the quota");
	CHECK(hipArrayCreate_(&y, &d2) == 0 && hipArray3DCreate_(&z, &d3) == 0 &&
	      FREE_NOW() <= GiB - 512 * MiB, "hipArrayCreate and hipArray3DCreate charged: %zu", f);
	CHECK(hipFreeArray_(x) == 0 && hipArrayDestroy_(y) == 0 && hipArrayDestroy_(z) == 0 &&
	      FREE_NOW() == GiB, "arrays credited: free %zu", f);
	(void)w;

	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;
	prop.location = (hipMemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
	hipMemGenericAllocationHandle_t h1 = NULL, h2 = NULL;
	CHECK(hipMemCreate_(&h1, 800 * MiB, &prop, 0) == 0 && hipMemCreate_(&h2, 800 * MiB, &prop, 0) == 0 &&
	      FREE_NOW() == GiB, "hipMemCreate on the host is not charged");
	CHECK(hipMemRelease_(h1) == 0 && hipMemRelease_(h2) == 0 && FREE_NOW() == GiB, "released");
	prop.location = (hipMemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CHECK(hipMemCreate_(&h1, 700 * MiB, &prop, 0) == 0 &&
	      hipMemCreate_(&h2, 700 * MiB, &prop, 0) == hipErrorOutOfMemory,
	      "hipMemCreate on the device is limited");
	CHECK(hipMemRelease_(h1) == 0 && FREE_NOW() == GiB, "credited");
#undef FREE_NOW
}

static void acl(void)
{
	void *lib = dlopen("libascendcl.so", RTLD_NOW);
	CHECK(lib != NULL, "libascendcl.so");
	if (!lib)
		return;
	SYM(lib, aclrtGetMemInfo); SYM(lib, aclrtMallocAlign32); SYM(lib, aclrtMallocCached);
	SYM(lib, aclrtMallocWithCfg); SYM(lib, aclrtFree); SYM(lib, aclrtFreeWithDevSync);
	SYM(lib, aclrtMallocPhysical); SYM(lib, aclrtFreePhysical);
	size_t f = 0, t = 0;
#define FREE_NOW() (aclrtGetMemInfo_(0, &f, &t), f)
	void *a = NULL, *b = NULL, *c = NULL;
	int oom = ACL_ERROR_RT_MEMORY_ALLOCATION;
	CHECK(aclrtMallocAlign32_(&a, 300 * MiB, 0) == 0 && aclrtMallocCached_(&b, 300 * MiB, 0) == 0 &&
	      aclrtMallocWithCfg_(&c, 300 * MiB, 0, NULL) == 0 && FREE_NOW() == GiB - 900 * MiB,
	      "aclrtMallocAlign32, aclrtMallocCached, aclrtMallocWithCfg charged: %zu", f);
	void *d = NULL;
	CHECK(aclrtMallocAlign32_(&d, 300 * MiB, 0) == oom && aclrtMallocCached_(&d, 300 * MiB, 0) == oom &&
	      aclrtMallocWithCfg_(&d, 300 * MiB, 0, NULL) == oom, "and limited");
	CHECK(aclrtFree_(a) == 0 && aclrtFreeWithDevSync_(b) == 0 && aclrtFree_(c) == 0 &&
	      FREE_NOW() == GiB, "aclrtFreeWithDevSync credits");
	aclrtPhysicalMemProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.location = (aclrtMemLocation){0, ACL_MEM_LOCATION_TYPE_HOST};
	aclrtDrvMemHandle h1 = NULL, h2 = NULL;
	CHECK(aclrtMallocPhysical_(&h1, 800 * MiB, &prop, 0) == 0 &&
	      aclrtMallocPhysical_(&h2, 800 * MiB, &prop, 0) == 0 && FREE_NOW() == GiB,
	      "aclrtMallocPhysical on the host is not charged");
	CHECK(aclrtFreePhysical_(h1) == 0 && aclrtFreePhysical_(h2) == 0, "released");
	prop.location = (aclrtMemLocation){0, ACL_MEM_LOCATION_TYPE_DEVICE};
	CHECK(aclrtMallocPhysical_(&h1, 700 * MiB, &prop, 0) == 0 &&
	      aclrtMallocPhysical_(&h2, 700 * MiB, &prop, 0) == oom, "on the device: limited");
	CHECK(aclrtFreePhysical_(h1) == 0 && FREE_NOW() == GiB, "credited");
#undef FREE_NOW
}

static void cambricon(void)
{
	void *cnrt = dlopen("libcnrt.so", RTLD_NOW), *cndrv = dlopen("libcndrv.so", RTLD_NOW);
	CHECK(cnrt && cndrv, "libcnrt.so and libcndrv.so");
	if (!cnrt || !cndrv)
		return;
	SYM(cnrt, cnrtMemGetInfo); SYM(cnrt, cnrtMallocPeerAble); SYM(cnrt, cnrtMallocFrameBuffer);
	SYM(cnrt, cnrtFreeArray); SYM(cndrv, cnZmalloc); SYM(cndrv, cnMallocConstant);
	SYM(cndrv, cnMallocSecurity); SYM(cndrv, cnMallocPeerAble); SYM(cndrv, cnFree);
	size_t f = 0, t = 0;
	void *p[3] = {NULL, NULL, NULL};
	CHECK(cnrtMallocPeerAble_(&p[0], 400 * MiB) == 0 && cnrtMallocFrameBuffer_(&p[1], 400 * MiB) == 0,
	      "cnrtMallocPeerAble, cnrtMallocFrameBuffer");
	CHECK(cnrtMallocFrameBuffer_(&p[2], 400 * MiB) == CNRT_RET_ERR_NOMEM &&
	      cnrtMallocPeerAble_(&p[2], 400 * MiB) == CNRT_RET_ERR_NOMEM, "limited");
	CHECK(cnrtFreeArray_(p, 2) == 0 && cnrtMemGetInfo_(&f, &t) == 0 && f == GiB,
	      "cnrtFreeArray credits them all: free %zu", f);
	CNaddr a = 0, b = 0, c = 0, d = 0, e = 0;
	CHECK(cnZmalloc_(&a, 250 * MiB) == 0 && cnMallocConstant_(&b, 250 * MiB) == 0 &&
	      cnMallocSecurity_(&c, 250 * MiB) == 0 && cnMallocPeerAble_(&d, 250 * MiB) == 0,
	      "cnZmalloc, cnMallocConstant, cnMallocSecurity, cnMallocPeerAble");
	CHECK(cnZmalloc_(&e, 100 * MiB) == CN_MEMORY_ERROR_OUT_OF_MEMORY &&
	      cnMallocConstant_(&e, 100 * MiB) == CN_MEMORY_ERROR_OUT_OF_MEMORY &&
	      cnMallocSecurity_(&e, 100 * MiB) == CN_MEMORY_ERROR_OUT_OF_MEMORY &&
	      cnMallocPeerAble_(&e, 100 * MiB) == CN_MEMORY_ERROR_OUT_OF_MEMORY, "all limited");
	CHECK(cnFree_(a) == 0 && cnFree_(b) == 0 && cnFree_(c) == 0 && cnFree_(d) == 0 &&
	      cnZmalloc_(&e, GiB) == 0 && cnFree_(e) == 0, "credited");
}

int main(void)
{
	hip();
	acl();
	cambricon();
	return check_done("vendor-paths");
}
