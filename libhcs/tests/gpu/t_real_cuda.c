/* libhcs against a real CUDA driver (needs a GPU; not part of `make test`): the quota on plain,
 * per-thread-stream, VMM (device and host-NUMA), array, context-limit and graph allocations,
 * cuGetProcAddress answering with our hooks, and, with COMPUTE_SHARE set, the compute share on
 * real kernels. Every driver call is looked up with dlsym, as applications do. */
#include <dlfcn.h>
#include <string.h>
#include <time.h>

#include "../../include/hcs_abi.h"
#include "../check.h"

typedef void *CUcontext, *CUmodule, *CUevent;
static void *cuda;
#define FN(name) ((__typeof__(&name##_t))fn(#name))
static void *fn(const char *name)
{
	void *f = dlsym(cuda, name);
	if (!f)
		printf("# %s: not found\n", name);
	return f;
}
/* Prototypes as in cuda.h, for the casts above. */
CUresult cuInit_t(unsigned int);
CUresult cuDeviceGet_t(CUdevice *, int);
CUresult cuDeviceGetAttribute_t(int *, int, CUdevice);
CUresult cuDevicePrimaryCtxRetain_t(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent_t(CUcontext);
CUresult cuCtxSynchronize_t(void);
CUresult cuMemGetInfo_v2_t(size_t *, size_t *);
CUresult cuMemAlloc_v2_t(CUdeviceptr *, size_t);
CUresult cuMemFree_v2_t(CUdeviceptr);
CUresult cuGetProcAddress_v2_t(const char *, void **, int, cuuint64_t, int *);
CUresult cuMemAllocAsync_t(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_t(CUdeviceptr, CUstream);
CUresult cuMemGetAllocationGranularity_t(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemCreate_t(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
		       unsigned long long);
CUresult cuMemRelease_t(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2_t(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArrayDestroy_t(CUarray);
CUresult cuCtxSetLimit_t(CUlimit, size_t);
CUresult cuGraphCreate_t(CUgraph *, unsigned int);
CUresult cuGraphAddMemAllocNode_t(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
				  CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode_t(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
				 CUdeviceptr);
CUresult cuGraphDestroy_t(CUgraph);
CUresult cuModuleLoadData_t(CUmodule *, const void *);
CUresult cuModuleGetFunction_t(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel_t(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			  unsigned int, unsigned int, unsigned int, CUstream, void **, void **);

static size_t free_now(void)
{
	size_t f = 0, t = 0;
	FN(cuMemGetInfo_v2)(&f, &t);
	return f;
}

static void memory(void)
{
	size_t f = 0, t = 0;
	CUdeviceptr a = 0, b = 0;
	CHECK(FN(cuMemGetInfo_v2)(&f, &t) == 0 && t == GiB, "memory info shows the 1Gi quota: %zu", t);
	CHECK(FN(cuMemAlloc_v2)(&a, 600 * MiB) == 0, "600Mi");
	CHECK(FN(cuMemAlloc_v2)(&b, 600 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "600Mi more refused");
	CHECK(FN(cuMemFree_v2)(a) == 0 && free_now() == GiB, "credited");

	void *got = NULL;
	int status = -1;
	CHECK(FN(cuGetProcAddress_v2)("cuMemAlloc", &got, 12000, 0, &status) == 0 &&
	      got == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "cuGetProcAddress answers with our hook");
	CHECK(FN(cuGetProcAddress_v2)("cuMemAllocAsync", &got, 12000,
				      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) == 0 &&
	      got == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"),
	      "per-thread default stream: our cuMemAllocAsync_ptsz hook (%p)", got);
	CHECK(got && ((__typeof__(&cuMemAllocAsync_t))got)(&a, 700 * MiB, NULL) == 0 &&
	      ((__typeof__(&cuMemAllocAsync_t))got)(&b, 700 * MiB, NULL) ==
		      CUDA_ERROR_OUT_OF_MEMORY, "and it is limited");
	void *release = NULL;
	CHECK(FN(cuGetProcAddress_v2)("cuMemFreeAsync", &release, 12000,
				      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) == 0 &&
	      ((__typeof__(&cuMemFreeAsync_t))release)(a, NULL) == 0 &&
	      FN(cuCtxSynchronize)() == 0 && free_now() == GiB, "its free credits");
	void *launch = NULL;
	CHECK(FN(cuGetProcAddress_v2)("cuLaunchKernel", &launch, 12000,
				      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) == 0 &&
	      launch == dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"), "cuLaunchKernel_ptsz hooked");
}

static void vmm(void)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;
	prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
	size_t granularity = 0;
	FN(cuMemGetAllocationGranularity)(&granularity, &prop, 0);
	CUmemGenericAllocationHandle h1 = 0, h2 = 0;
	CHECK(FN(cuMemCreate)(&h1, 600 * MiB, &prop, 0) == 0, "VMM 600Mi on the device");
	CHECK(FN(cuMemCreate)(&h2, 600 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "limited");
	CHECK(FN(cuMemRelease)(h1) == 0 && free_now() == GiB, "credited");
	prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
	CUresult rc1 = FN(cuMemCreate)(&h1, 800 * MiB, &prop, 0);
	CUresult rc2 = FN(cuMemCreate)(&h2, 800 * MiB, &prop, 0);
	printf("# host-NUMA cuMemCreate: %d, %d\n", rc1, rc2);
	CHECK(rc1 != CUDA_ERROR_OUT_OF_MEMORY && rc2 != CUDA_ERROR_OUT_OF_MEMORY &&
	      free_now() == GiB, "host-NUMA memory is not charged (driver said %d, %d)", rc1, rc2);
	if (rc1 == 0)
		FN(cuMemRelease)(h1);
	if (rc2 == 0)
		FN(cuMemRelease)(h2);
	CHECK(free_now() == GiB, "nothing credited for it either");
}

static void others(void)
{
	CUarray array = NULL;
	CUDA_ARRAY_DESCRIPTOR d = {8192, 8192, 0x20, 1};
	CHECK(FN(cuArrayCreate_v2)(&array, &d) == 0 && free_now() <= GiB - 256 * MiB,
	      "a 256Mi array is charged: free %zu", free_now());
	CHECK(FN(cuArrayDestroy)(array) == 0 && free_now() == GiB, "and credited");
	CHECK(FN(cuCtxSetLimit)(CU_LIMIT_MALLOC_HEAP_SIZE, 300 * MiB) == 0 &&
	      free_now() == GiB - 300 * MiB, "a 300Mi device heap is charged");
	CHECK(FN(cuCtxSetLimit)(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MiB) == 0 &&
	      free_now() == GiB - 8 * MiB, "set back to 8Mi");
	int sms = 0, threads = 0;
	FN(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
	FN(cuDeviceGetAttribute)(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0);
	size_t stacks = (size_t)sms * threads * 1024;
	CHECK(FN(cuCtxSetLimit)(CU_LIMIT_STACK_SIZE, 1024) == 0 &&
	      free_now() == GiB - 8 * MiB - stacks, "1 KiB stacks: %d x %d threads charged", sms,
	      threads);
	CUgraph graph = NULL;
	CUgraphNode node;
	CUDA_MEM_ALLOC_NODE_PARAMS params;
	memset(&params, 0, sizeof(params));
	params.poolProps.allocType = 1;
	params.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
	params.bytesize = 500 * MiB;
	size_t before = free_now();
	CHECK(FN(cuGraphCreate)(&graph, 0) == 0 &&
	      FN(cuGraphAddMemAllocNode)(&node, graph, NULL, 0, &params) == 0 &&
	      free_now() == before - 500 * MiB, "a graph allocation node is charged");
	CUgraphNode freeing;
	CHECK(FN(cuGraphAddMemFreeNode)(&freeing, graph, &node, 1, params.dptr) == 0 &&
	      FN(cuGraphDestroy)(graph) == 0 && free_now() == before, "credited with its graph");
}

/* A kernel that spins for `cycles` clock cycles. */
static const char ptx[] =
	".version 8.0\n.target sm_80\n.address_size 64\n"
	".visible .entry spin(.param .u64 cycles)\n{\n"
	"  .reg .pred p;\n  .reg .u64 start, now, limit, d;\n"
	"  ld.param.u64 limit, [cycles];\n  mov.u64 start, %clock64;\n"
	"loop:\n  mov.u64 now, %clock64;\n  sub.u64 d, now, start;\n"
	"  setp.lt.u64 p, d, limit;\n  @p bra loop;\n  ret;\n}\n";

static double seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void compute(double share)
{
	CUmodule module;
	CUfunction spin;
	CHECK(FN(cuModuleLoadData)(&module, ptx) == 0 &&
	      FN(cuModuleGetFunction)(&spin, module, "spin") == 0, "spin kernel loaded");
	int khz = 0;
	FN(cuDeviceGetAttribute)(&khz, 13 /* CLOCK_RATE */, 0);
	unsigned long long cycles = (unsigned long long)khz; /* about 1 ms */
	void *args[] = {&cycles};
	double start = seconds();
	FN(cuLaunchKernel)(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
	FN(cuCtxSynchronize)();
	double kernel = seconds() - start;
	int launches = 0;
	start = seconds();
	while (seconds() - start < 2.0) {
		FN(cuLaunchKernel)(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
		launches++;
	}
	FN(cuCtxSynchronize)();
	double wall = seconds() - start, busy = launches * kernel / wall;
	printf("# %d launches of %.2f ms in %.2f s: device busy %.1f%% (share %.0f%%)\n", launches,
	       kernel * 1e3, wall, busy * 100, share * 100);
	CHECK(share >= 1.0 ? busy > 0.8 : busy > share - 0.1 && busy < share + 0.1,
	      "busy %.3f at a %.2f share", busy, share);
}

int main(void)
{
	cuda = dlopen("libcuda.so.1", RTLD_NOW);
	CHECK(cuda != NULL, "libcuda.so.1: %s", dlerror());
	if (!cuda)
		return check_done("real-cuda");
	CUdevice device;
	CUcontext context;
	CHECK(FN(cuInit)(0) == 0 && FN(cuDeviceGet)(&device, 0) == 0 &&
	      FN(cuDevicePrimaryCtxRetain)(&context, device) == 0 &&
	      FN(cuCtxSetCurrent)(context) == 0, "a context on GPU 0");
	const char *share = getenv("COMPUTE_SHARE");
	if (share) {
		compute(atof(share) / 100.0);
	} else {
		memory();
		vmm();
		others();
	}
	return check_done("real-cuda");
}
