/* Ascend (CANN): ACL (`aclrtMalloc`, …) and the runtime layer beneath it (`rtMalloc`, …), which
 * frameworks also call directly. Both report ACL_ERROR_RT_MEMORY_ALLOCATION (207001), the code
 * CANN's runtime returns for a failed device allocation. Rows in symbols.h. */
#include "backend.h"

static const char *const acl_libraries[] = {"libascendcl.so", NULL};
static const char *const rt_libraries[] = {"libruntime.so", NULL};
#define HCS_OK_acl ACL_SUCCESS
#define HCS_OOM_acl ACL_ERROR_RT_MEMORY_ALLOCATION
#define HCS_MISSING_acl 100000 /* ACL_ERROR_INVALID_PARAM: the library lacks the function */
#define HCS_OK_rt RT_ERROR_NONE
#define HCS_OOM_rt ACL_ERROR_RT_MEMORY_ALLOCATION
#define HCS_MISSING_rt 100000
#define ACL_HELPERS(Y) Y(acl, aclError, aclrtGetDevice, (int32_t *device))
#define RT_HELPERS(Y) Y(rt, rtError_t, rtGetDevice, (int32_t *device))

HCS_BACKEND(acl, HCS_SYMBOLS_acl, ACL_HELPERS)
HCS_BACKEND(rt, HCS_SYMBOLS_rt, RT_HELPERS)

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

HCS_SYMBOLS_acl(HCS_DEFINE_HOOK)
HCS_SYMBOLS_rt(HCS_DEFINE_HOOK)

/* Physical memory for ACL's VMM calls: charged on the device its location names; host memory
 * (ACL_MEM_LOCATION_TYPE_HOST) is not charged. */
aclError hcs_aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size,
				 const aclrtPhysicalMemProp *prop, uint64_t flags)
{
	acl_ready();
	if (!real_aclrtMallocPhysical)
		return HCS_MISSING_acl;
	int device = !prop ? acl_ordinal()
		   : prop->location.type == ACL_MEM_LOCATION_TYPE_HOST	 ? -1
		   : prop->location.type == ACL_MEM_LOCATION_TYPE_DEVICE ? (int)prop->location.id
									 : acl_ordinal();
	if (!hcs_enforcing() || device < 0)
		return real_aclrtMallocPhysical(handle, size, prop, flags);
	HCS_ALLOC_ON(acl, aclrtMallocPhysical, (handle, size, prop, flags), HCS_KIND_ACL_PHYS,
		     (uintptr_t)*handle, size, device);
}
