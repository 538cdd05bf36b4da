/* Ascend (CANN): ACL (`aclrtMalloc`, …) and the runtime layer beneath it (`rtMalloc`, …), which
 * frameworks also call directly. Both report ACL_ERROR_RT_MEMORY_ALLOCATION (207001), the code
 * CANN's runtime returns for a failed device allocation. */
#include <pthread.h>

#include "common.h"

static const char *const acl_libraries[] = {"libascendcl.so", NULL};
static const char *const rt_libraries[] = {"libruntime.so", NULL};
static aclError (*real_aclrtMalloc)(void **, size_t, aclrtMemMallocPolicy);
static aclError (*real_aclrtFree)(void *);
static aclError (*real_aclrtGetMemInfo)(aclrtMemAttr, size_t *, size_t *);
static aclError (*real_aclrtGetDevice)(int32_t *);
static rtError_t (*real_rtMalloc)(void **, uint64_t, int, uint16_t);
static rtError_t (*real_rtFree)(void *);
static rtError_t (*real_rtMallocPhysical)(rtDrvMemHandle_t *, size_t, void *, uint64_t);
static rtError_t (*real_rtFreePhysical)(rtDrvMemHandle_t);
static rtError_t (*real_rtMemGetInfoEx)(rtMemInfoType_t, size_t *, size_t *);
static rtError_t (*real_rtGetDevice)(int32_t *);
static pthread_once_t acl_once = PTHREAD_ONCE_INIT, rt_once = PTHREAD_ONCE_INIT;

static void resolve_acl(void)
{
	HCS_RESOLVE(acl_libraries, aclrtMalloc);
	HCS_RESOLVE(acl_libraries, aclrtFree);
	HCS_RESOLVE(acl_libraries, aclrtGetMemInfo);
	HCS_RESOLVE(acl_libraries, aclrtGetDevice);
}

static void resolve_rt(void)
{
	HCS_RESOLVE(rt_libraries, rtMalloc);
	HCS_RESOLVE(rt_libraries, rtFree);
	HCS_RESOLVE(rt_libraries, rtMallocPhysical);
	HCS_RESOLVE(rt_libraries, rtFreePhysical);
	HCS_RESOLVE(rt_libraries, rtMemGetInfoEx);
	HCS_RESOLVE(rt_libraries, rtGetDevice);
}

static int acl_ordinal(void)
{
	int32_t device = 0;
	if (real_aclrtGetDevice && real_aclrtGetDevice(&device) == ACL_SUCCESS)
		return device;
	return 0;
}

static int rt_ordinal(void)
{
	int32_t device = 0;
	if (real_rtGetDevice && real_rtGetDevice(&device) == RT_ERROR_NONE)
		return device;
	return 0;
}

#define NOT_FOUND 100000 /* ACL_ERROR_INVALID_PARAM: the library lacks the function */

aclError hcs_aclrtMalloc(void **ptr, size_t size, aclrtMemMallocPolicy policy)
{
	pthread_once(&acl_once, resolve_acl);
	if (!real_aclrtMalloc)
		return NOT_FOUND;
	if (!hcs_enforcing())
		return real_aclrtMalloc(ptr, size, policy);
	int device = acl_ordinal();
	if (hcs_alloc_begin(device, size) != 0)
		return ACL_ERROR_RT_MEMORY_ALLOCATION;
	aclError rc = real_aclrtMalloc(ptr, size, policy);
	hcs_alloc_end(rc == ACL_SUCCESS, rc == ACL_SUCCESS ? (uint64_t)(uintptr_t)*ptr : 0,
		      HCS_KIND_ACL, device, size);
	return rc;
}

aclError hcs_aclrtFree(void *ptr)
{
	pthread_once(&acl_once, resolve_acl);
	if (!real_aclrtFree)
		return NOT_FOUND;
	int device;
	uint64_t size;
	bool tracked = hcs_free_begin((uint64_t)(uintptr_t)ptr, HCS_KIND_ACL, &device, &size);
	aclError rc = real_aclrtFree(ptr);
	hcs_free_end(tracked, rc == ACL_SUCCESS, (uint64_t)(uintptr_t)ptr, HCS_KIND_ACL, device,
		     size);
	return rc;
}

aclError hcs_aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_bytes, size_t *total_bytes)
{
	pthread_once(&acl_once, resolve_acl);
	if (!real_aclrtGetMemInfo)
		return NOT_FOUND;
	aclError rc = real_aclrtGetMemInfo(attr, free_bytes, total_bytes);
	if (rc == ACL_SUCCESS && hcs_cfg.enforcing)
		hcs_clamp_info(acl_ordinal(), free_bytes, total_bytes);
	return rc;
}

rtError_t hcs_rtMalloc(void **ptr, uint64_t size, int type, uint16_t module_id)
{
	pthread_once(&rt_once, resolve_rt);
	if (!real_rtMalloc)
		return NOT_FOUND;
	if (!hcs_enforcing())
		return real_rtMalloc(ptr, size, type, module_id);
	int device = rt_ordinal();
	if (hcs_alloc_begin(device, size) != 0)
		return ACL_ERROR_RT_MEMORY_ALLOCATION;
	rtError_t rc = real_rtMalloc(ptr, size, type, module_id);
	hcs_alloc_end(rc == RT_ERROR_NONE, rc == RT_ERROR_NONE ? (uint64_t)(uintptr_t)*ptr : 0,
		      HCS_KIND_RT, device, size);
	return rc;
}

rtError_t hcs_rtFree(void *ptr)
{
	pthread_once(&rt_once, resolve_rt);
	if (!real_rtFree)
		return NOT_FOUND;
	int device;
	uint64_t size;
	bool tracked = hcs_free_begin((uint64_t)(uintptr_t)ptr, HCS_KIND_RT, &device, &size);
	rtError_t rc = real_rtFree(ptr);
	hcs_free_end(tracked, rc == RT_ERROR_NONE, (uint64_t)(uintptr_t)ptr, HCS_KIND_RT, device,
		     size);
	return rc;
}

rtError_t hcs_rtMallocPhysical(rtDrvMemHandle_t *handle, size_t size, void *prop, uint64_t flags)
{
	pthread_once(&rt_once, resolve_rt);
	if (!real_rtMallocPhysical)
		return NOT_FOUND;
	if (!hcs_enforcing())
		return real_rtMallocPhysical(handle, size, prop, flags);
	int device = rt_ordinal();
	if (hcs_alloc_begin(device, size) != 0)
		return ACL_ERROR_RT_MEMORY_ALLOCATION;
	rtError_t rc = real_rtMallocPhysical(handle, size, prop, flags);
	hcs_alloc_end(rc == RT_ERROR_NONE, rc == RT_ERROR_NONE ? (uint64_t)(uintptr_t)*handle : 0,
		      HCS_KIND_RT_PHYS, device, size);
	return rc;
}

rtError_t hcs_rtFreePhysical(rtDrvMemHandle_t handle)
{
	pthread_once(&rt_once, resolve_rt);
	if (!real_rtFreePhysical)
		return NOT_FOUND;
	int device;
	uint64_t size;
	bool tracked = hcs_free_begin((uint64_t)(uintptr_t)handle, HCS_KIND_RT_PHYS, &device, &size);
	rtError_t rc = real_rtFreePhysical(handle);
	hcs_free_end(tracked, rc == RT_ERROR_NONE, (uint64_t)(uintptr_t)handle, HCS_KIND_RT_PHYS,
		     device, size);
	return rc;
}

rtError_t hcs_rtMemGetInfoEx(rtMemInfoType_t type, size_t *free_bytes, size_t *total_bytes)
{
	pthread_once(&rt_once, resolve_rt);
	if (!real_rtMemGetInfoEx)
		return NOT_FOUND;
	rtError_t rc = real_rtMemGetInfoEx(type, free_bytes, total_bytes);
	if (rc == RT_ERROR_NONE && hcs_cfg.enforcing)
		hcs_clamp_info(rt_ordinal(), free_bytes, total_bytes);
	return rc;
}
