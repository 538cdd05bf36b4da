/* A fake libnvidia-ml.so.1: 8 devices, handles are 1-based indexes, UUIDs GPU-fake-<index>,
 * memory as the fake driver sees it (FAKE_TOTAL_MIB per device, 1 GiB used by "others"). */
#include <stdio.h>

#include "../../include/hcs_abi.h"
#include "fake_memory.h"

FAKE_API nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (index >= 8) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
	*device = (nvmlDevice_t)(uintptr_t)(index + 1);
	return NVML_SUCCESS;
}
FAKE_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	*index = (unsigned int)((uintptr_t)device - 1);
	return NVML_SUCCESS;
}
FAKE_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	snprintf(uuid, length, "GPU-fake-%u", (unsigned int)((uintptr_t)device - 1));
	return NVML_SUCCESS;
}
FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	(void)device;
	memory->total = fake_total();
	memory->used = 1ULL << 30;
	memory->free = memory->total - memory->used;
	return NVML_SUCCESS;
}
FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	(void)device;
	memory->total = fake_total();
	memory->reserved = 256ULL << 20;
	memory->used = 1ULL << 30;
	memory->free = memory->total - memory->used - memory->reserved;
	return NVML_SUCCESS;
}
