/* Where VMM and pool memory lives decides whether it is charged: host, host-NUMA and
 * host-NUMA-current locations are host memory (passed through, never charged, never credited);
 * device locations are charged to the device they name, not to the current one. Layouts and
 * enum values are cuda.h's. Run with HCS_VRAM_QUOTA=1Gi. */
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
		     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
void fakeSetDevice(int);

static size_t free_on(int device)
{
	size_t f = 0, t = 0;
	fakeSetDevice(device);
	cuMemGetInfo_v2(&f, &t);
	fakeSetDevice(0);
	return f;
}

static CUmemAllocationProp located(int type, int id)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop)); /* what llama.cpp/ggml do before filling it */
	prop.type = 1;                  /* CU_MEM_ALLOCATION_TYPE_PINNED */
	prop.location.type = type;
	prop.location.id = id;
	return prop;
}

int main(void)
{
	static const struct { int type, id; const char *name; } hosts[] = {
		{CU_MEM_LOCATION_TYPE_HOST, 0, "host"},
		{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0, "host NUMA node 0"},
		{CU_MEM_LOCATION_TYPE_HOST_NUMA, 1, "host NUMA node 1"},
		{CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0, "host NUMA current"},
	};
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
		CUmemAllocationProp prop = located(hosts[i].type, hosts[i].id);
		CUmemGenericAllocationHandle h1 = 0, h2 = 0;
		CUdeviceptr d = 0;
		CHECK(cuMemCreate(&h1, 800 * MiB, &prop, 0) == 0, "%s: 800Mi created", hosts[i].name);
		CHECK(cuMemCreate(&h2, 800 * MiB, &prop, 0) == 0, "%s: 1.6Gi of host memory is not "
		      "refused at a 1Gi VRAM quota", hosts[i].name);
		CHECK(free_on(0) == GiB, "%s: GPU 0 uncharged: free %zu", hosts[i].name, free_on(0));
		CHECK(cuMemAlloc_v2(&d, 900 * MiB) == 0, "%s: the GPU still has its quota",
		      hosts[i].name);
		CHECK(cuMemRelease(h1) == 0 && cuMemRelease(h2) == 0, "%s: released", hosts[i].name);
		CHECK(free_on(0) == GiB - 900 * MiB, "%s: releasing host memory gives no VRAM back: "
		      "free %zu", hosts[i].name, free_on(0));
		CHECK(cuMemFree_v2(d) == 0 && free_on(0) == GiB, "%s: device memory credited",
		      hosts[i].name);
	}

	/* A device location is charged to the device it names, whatever the current one is. */
	CUmemAllocationProp on1 = located(CU_MEM_LOCATION_TYPE_DEVICE, 1);
	CUmemGenericAllocationHandle h = 0, again = 0;
	CHECK(cuMemCreate(&h, 700 * MiB, &on1, 0) == 0, "700Mi on GPU 1 from GPU 0's context");
	CHECK(free_on(0) == GiB && free_on(1) == GiB - 700 * MiB, "charged to GPU 1: free %zu/%zu",
	      free_on(0), free_on(1));
	CHECK(cuMemCreate(&again, 700 * MiB, &on1, 0) == CUDA_ERROR_OUT_OF_MEMORY,
	      "GPU 1's quota holds");
	CHECK(cuMemRelease(h) == 0 && free_on(1) == GiB, "credited to GPU 1");
	CUmemAllocationProp invalid = located(CU_MEM_LOCATION_TYPE_INVALID, 0);
	CHECK(cuMemCreate(&h, 100 * MiB, &invalid, 0) == CUDA_ERROR_INVALID_VALUE &&
	      free_on(0) == GiB, "an invalid location is the driver's to refuse; nothing kept");

	/* Pools: allocations land where the pool lives. */
	CUmemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = 1;
	props.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
	CUmemoryPool host_pool = NULL, device1_pool = NULL, default1 = NULL;
	CUdeviceptr a = 0, b = 0, c = 0;
	CHECK(cuMemPoolCreate(&host_pool, &props) == 0, "host-NUMA pool");
	CHECK(cuMemAllocFromPoolAsync(&a, 800 * MiB, host_pool, NULL) == 0 &&
	      cuMemAllocFromPoolAsync(&b, 800 * MiB, host_pool, NULL) == 0,
	      "1.6Gi from a host pool is not refused");
	CHECK(free_on(0) == GiB, "host pool uncharged: free %zu", free_on(0));
	CHECK(cuMemFreeAsync(a, NULL) == 0 && cuMemFreeAsync(b, NULL) == 0 && free_on(0) == GiB,
	      "host pool frees give nothing back");
	props.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 1};
	CHECK(cuMemPoolCreate(&device1_pool, &props) == 0, "GPU 1 pool");
	CHECK(cuMemAllocFromPoolAsync(&c, 600 * MiB, device1_pool, NULL) == 0 &&
	      free_on(0) == GiB && free_on(1) == GiB - 600 * MiB, "charged to GPU 1: %zu/%zu",
	      free_on(0), free_on(1));
	CHECK(cuDeviceGetMemPool(&default1, 1) == 0 &&
	      cuMemAllocFromPoolAsync(&a, 600 * MiB, default1, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
	      "GPU 1's current pool counts against GPU 1");
	CHECK(cuMemFreeAsync(c, NULL) == 0 && free_on(1) == GiB, "credited to GPU 1");
	CHECK(cuMemPoolDestroy(host_pool) == 0 && cuMemPoolDestroy(device1_pool) == 0, "destroyed");
	return check_done("vmm-locations");
}
