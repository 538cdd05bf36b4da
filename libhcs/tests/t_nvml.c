/* nvidia-smi's view: NVML memory info reports the quota for the container's device (matched by
 * UUID from quota.conf) and the container's usage. Run with HCS_CONFIG. */
#include "../include/hcs_abi.h"
#include "check.h"

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

int main(void)
{
	nvmlDevice_t device, other;
	nvmlMemory_t memory;
	nvmlMemory_v2_t memory2 = {.version = 2};
	CUdeviceptr p;
	nvmlInit_v2();
	nvmlDeviceGetHandleByIndex_v2(3, &device); /* GPU-fake-3 is device.0 in quota.conf */
	nvmlDeviceGetHandleByIndex_v2(5, &other);
	CHECK(cuMemAlloc_v2(&p, 256 * MiB) == 0, "allocate on the container's device");
	CHECK(nvmlDeviceGetMemoryInfo(device, &memory) == 0 && memory.total == 2 * GiB &&
	      memory.used == 256 * MiB && memory.free == 2 * GiB - 256 * MiB,
	      "v1: total %llu used %llu free %llu", memory.total, memory.used, memory.free);
	CHECK(nvmlDeviceGetMemoryInfo_v2(device, &memory2) == 0 && memory2.total == 2 * GiB &&
	      memory2.used == 256 * MiB && memory2.reserved == 0, "v2 shows the quota");
	CHECK(nvmlDeviceGetMemoryInfo(other, &memory) == 0 && memory.total == 80 * GiB,
	      "a device outside the quota file is reported as the driver says");
	return check_done("nvml");
}
