/* HIP (Hygon DCU, via DTK/ROCm): allocations, frees and memory info (rows in symbols.h). */
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
