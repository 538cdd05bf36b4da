/* HIP (Hygon DCU, via DTK/ROCm): allocations (plain, managed, stream-ordered, pool, pitched,
 * arrays, VMM), frees and memory info. Rows in symbols.h; the irregular hooks here. */
#include "backend.h"

static const char *const hip_libraries[] = {"libamdhip64.so", "libamdhip64.so.6",
					    "libamdhip64.so.5", NULL};
#define HCS_OK_hip hipSuccess
#define HCS_OOM_hip hipErrorOutOfMemory
#define HCS_MISSING_hip 500 /* hipErrorNotFound */
#define HIP_HELPERS(Y) Y(hip, hipError_t, hipGetDevice, (int *device))

HCS_BACKEND(hip, HCS_SYMBOLS_hip, HIP_HELPERS)

static inline int hip_ordinal(void)
{
	int device = 0;
	if (real_hipGetDevice && real_hipGetDevice(&device) == hipSuccess)
		return device;
	return 0;
}

HCS_SYMBOLS_hip(HCS_DEFINE_HOOK)

/* Pitched allocations: the driver picks the pitch; charged at what it took (see hcs_settle). */
#define HIP_PITCHED(name, args, ptr_expr, pitch_expr, estimate, rows)                        \
	hip_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_hip;                                                      \
	if (!hcs_enforcing())                                                                \
		return real_##name args;                                                     \
	int device = hip_ordinal();                                                          \
	if (hcs_alloc_begin(device, (estimate)) != 0)                                        \
		return hipErrorOutOfMemory;                                                  \
	hipError_t rc = real_##name args;                                                    \
	if (rc != hipSuccess) {                                                              \
		hcs_alloc_end(false, 0, HCS_KIND_HIP, device, (estimate));                   \
		return rc;                                                                   \
	}                                                                                    \
	uint64_t actual = (uint64_t)(pitch_expr) * (rows);                                   \
	if (!hcs_settle(device, (estimate), actual)) {                                       \
		if (real_hipFree)                                                            \
			real_hipFree(ptr_expr);                                              \
		hcs_alloc_end(false, 0, HCS_KIND_HIP, device, (estimate));                   \
		return hipErrorOutOfMemory;                                                  \
	}                                                                                    \
	hcs_alloc_end(true, (uint64_t)(uintptr_t)(ptr_expr), HCS_KIND_HIP, device, actual);  \
	return rc

hipError_t hcs_hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	HIP_PITCHED(hipMallocPitch, (ptr, pitch, width, height), *ptr, *pitch,
		    (uint64_t)width * height, height);
}

hipError_t hcs_hipMemAllocPitch(hipDeviceptr_t *ptr, size_t *pitch, size_t width, size_t height,
				unsigned int element_size)
{
	HIP_PITCHED(hipMemAllocPitch, (ptr, pitch, width, height, element_size), *ptr, *pitch,
		    (uint64_t)width * height, height);
}

/* hipExtent.width is in bytes here; the pitch covers height x depth rows. */
hipError_t hcs_hipMalloc3D(hipPitchedPtr *pitched, hipExtent extent)
{
	uint64_t rows = (uint64_t)extent.height * (extent.depth ? extent.depth : 1);
	HIP_PITCHED(hipMalloc3D, (pitched, extent), pitched->ptr, pitched->pitch,
		    (uint64_t)extent.width * rows, rows);
}

/* Arrays: storage from the descriptor (sizes.c), charged on the current device. */
#define HIP_ARRAY(name, args, bytes)                                                         \
	hip_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_hip;                                                      \
	if (!hcs_enforcing() || !desc)                                                       \
		return real_##name args;                                                     \
	HCS_ALLOC_ON(hip, name, args, HCS_KIND_HIP_ARRAY, (uintptr_t)*array, (bytes),        \
		     hip_ordinal())

static uint64_t channel_bytes(const hipChannelFormatDesc *desc)
{
	int bits = desc->x + desc->y + desc->z + desc->w;
	return bits > 0 ? ((uint64_t)bits + 7) / 8 : 16;
}

hipError_t hcs_hipMallocArray(hipArray_t *array, const hipChannelFormatDesc *desc, size_t width,
			      size_t height, unsigned int flags)
{
	HIP_ARRAY(hipMallocArray, (array, desc, width, height, flags),
		  hcs_array_bytes(width, height, 0, channel_bytes(desc), flags, 1));
}

hipError_t hcs_hipMalloc3DArray(hipArray_t *array, const hipChannelFormatDesc *desc,
				hipExtent extent, unsigned int flags)
{
	HIP_ARRAY(hipMalloc3DArray, (array, desc, extent, flags),
		  hcs_array_bytes(extent.width, extent.height, extent.depth, channel_bytes(desc),
				  flags, 1));
}

hipError_t hcs_hipArrayCreate(hipArray_t *array, const HIP_ARRAY_DESCRIPTOR *desc)
{
	HIP_ARRAY(hipArrayCreate, (array, desc),
		  hcs_array_bytes(desc->Width, desc->Height, 0,
				  hcs_array_element(desc->Format, desc->NumChannels), 0, 1));
}

hipError_t hcs_hipArray3DCreate(hipArray_t *array, const HIP_ARRAY3D_DESCRIPTOR *desc)
{
	HIP_ARRAY(hipArray3DCreate, (array, desc),
		  hcs_array_bytes(desc->Width, desc->Height, desc->Depth,
				  hcs_array_element(desc->Format, desc->NumChannels), desc->Flags, 1));
}

/* VMM: charged on the device its location names; host locations are not charged. */
hipError_t hcs_hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
			    const hipMemAllocationProp *prop, unsigned long long flags)
{
	hip_ready();
	if (!real_hipMemCreate)
		return HCS_MISSING_hip;
	int device = !prop ? hip_ordinal()
		   : prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id
		   : prop->location.type >= CU_MEM_LOCATION_TYPE_HOST &&
				   prop->location.type <= CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
			   ? -1
			   : hip_ordinal();
	if (!hcs_enforcing() || device < 0)
		return real_hipMemCreate(handle, size, prop, flags);
	HCS_ALLOC_ON(hip, hipMemCreate, (handle, size, prop, flags), HCS_KIND_HIP_VMM,
		     (uintptr_t)*handle, size, device);
}
