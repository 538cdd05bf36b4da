/* NVML memory info, so that nvidia-smi inside the container shows the quota: total is the
 * limit, used is the container's accounted usage. The device is matched by UUID against the
 * quota file (ordinals inside the container need not equal NVML's indexes). */
#include "backend.h"

static const char *const nvml_libraries[] = {"libnvidia-ml.so.1", "libnvidia-ml.so", NULL};
#define HCS_MISSING_nvml 13 /* NVML_ERROR_FUNCTION_NOT_FOUND */
#define NVML_HELPERS(Y)                                                                      \
	Y(nvml, nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t d, char *uuid, unsigned int n)) \
	Y(nvml, nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t d, unsigned int *index))

HCS_BACKEND(nvml, HCS_SYMBOLS_nvml, NVML_HELPERS)

static int ordinal_of(nvmlDevice_t device)
{
	if (hcs_cfg.uniform) {
		unsigned int index = 0;
		if (real_nvmlDeviceGetIndex && real_nvmlDeviceGetIndex(device, &index) == NVML_SUCCESS)
			return (int)index;
		return 0;
	}
	char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
	if (!real_nvmlDeviceGetUUID ||
	    real_nvmlDeviceGetUUID(device, uuid, sizeof(uuid)) != NVML_SUCCESS)
		return -1;
	return hcs_ordinal_of_uuid(uuid);
}

static void adjust(int ordinal, unsigned long long *total, unsigned long long *free_bytes,
		   unsigned long long *used)
{
	uint64_t limit = hcs_limit_of(ordinal);
	if (ordinal < 0 || limit == UINT64_MAX)
		return;
	uint64_t mine = hcs_used_of(ordinal);
	if (*total > limit)
		*total = limit;
	*used = mine;
	*free_bytes = mine < *total ? *total - mine : 0;
}

nvmlReturn_t hcs_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	nvml_ready();
	if (!real_nvmlDeviceGetMemoryInfo)
		return HCS_MISSING_nvml;
	nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo(device, memory);
	if (rc == NVML_SUCCESS && hcs_cfg.enforcing && memory)
		adjust(ordinal_of(device), &memory->total, &memory->free, &memory->used);
	return rc;
}

nvmlReturn_t hcs_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	nvml_ready();
	if (!real_nvmlDeviceGetMemoryInfo_v2)
		return HCS_MISSING_nvml;
	nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo_v2(device, memory);
	if (rc == NVML_SUCCESS && hcs_cfg.enforcing && memory) {
		adjust(ordinal_of(device), &memory->total, &memory->free, &memory->used);
		memory->reserved = 0;
	}
	return rc;
}
