/* Allocation paths beside cuMemAlloc: the per-thread-default-stream entry points (linked, and
 * as cuGetProcAddress gives them), arrays, context limits that reserve memory, graph memory
 * nodes, and imported VMM handles. Each is refused past the quota and credited exactly when
 * released. Layouts and codes are cuda.h's. Run with HCS_VRAM_QUOTA=1Gi. */
#include <dlfcn.h>
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuCtxSetLimit(CUlimit, size_t);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
				CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuGraphAddNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
			   size_t, CUgraphNodeParams *);
CUresult cuGraphDestroy(CUgraph);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
		     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle,
				      CUmemAllocationHandleType, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *,
					CUmemAllocationHandleType);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);

static size_t free_now(void)
{
	size_t f = 0, t = 0;
	cuMemGetInfo_v2(&f, &t);
	return f;
}

typedef CUresult (*async_alloc_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*async_free_fn)(CUdeviceptr, CUstream);
typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static void per_thread_stream(void)
{
	CUdeviceptr a = 0, b = 0;
	CHECK(cuMemAllocAsync_ptsz(&a, 700 * MiB, NULL) == 0, "cuMemAllocAsync_ptsz within quota");
	CHECK(cuMemAllocAsync_ptsz(&b, 700 * MiB, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
	      "cuMemAllocAsync_ptsz over quota");
	CHECK(cuMemFreeAsync_ptsz(a, NULL) == 0 && free_now() == GiB, "cuMemFreeAsync_ptsz credits");
	CHECK(cuMemAllocFromPoolAsync_ptsz(&a, 700 * MiB, NULL, NULL) == 0 &&
	      cuMemAllocFromPoolAsync_ptsz(&b, 700 * MiB, NULL, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
	      "cuMemAllocFromPoolAsync_ptsz limited");
	CHECK(cuMemFreeAsync_ptsz(a, NULL) == 0 && free_now() == GiB, "credited");

	void *fn = NULL, *plain = NULL;
	int ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	CHECK(cuGetProcAddress("cuMemAllocAsync", &fn, 12000, ptds) == 0 &&
	      cuGetProcAddress("cuMemAllocAsync", &plain, 12000, 0) == 0 && fn && fn != plain,
	      "the per-thread flag gives another entry point");
	CHECK(((async_alloc_fn)fn)(&a, 700 * MiB, NULL) == 0 &&
	      ((async_alloc_fn)fn)(&b, 700 * MiB, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
	      "cuGetProcAddress(PER_THREAD_DEFAULT_STREAM) cuMemAllocAsync is limited");
	CHECK(cuGetProcAddress("cuMemFreeAsync", &fn, 12000, ptds) == 0 &&
	      ((async_free_fn)fn)(a, NULL) == 0 && free_now() == GiB, "and its free credits");
	CHECK(cuGetProcAddress("cuMemAllocFromPoolAsync", &fn, 12000, ptds) == 0 &&
	      ((pool_alloc_fn)fn)(&a, 700 * MiB, NULL, NULL) == 0 &&
	      ((pool_alloc_fn)fn)(&b, 700 * MiB, NULL, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
	      "cuGetProcAddress(PER_THREAD_DEFAULT_STREAM) cuMemAllocFromPoolAsync is limited");
	CHECK(cuMemFree_v2(a) == 0 && free_now() == GiB, "credited");
}

static void arrays(void)
{
	CUarray a = NULL, b = NULL, c = NULL;
	CUmipmappedArray m = NULL;
	CUDA_ARRAY_DESCRIPTOR d2 = {8192, 8192, 0x20 /* FLOAT */, 1};         /* 256Mi */
	CUDA_ARRAY3D_DESCRIPTOR d3 = {1024, 1024, 256, 0x01 /* UINT8 */, 2, 0}; /* 512Mi */
	CUDA_ARRAY3D_DESCRIPTOR mip = {4096, 4096, 0, 0x10 /* HALF */, 1, 0};  /* 32Mi + levels */
	CUDA_ARRAY_DESCRIPTOR huge = {16384, 16384, 0x20, 4};                 /* 4Gi */
	CHECK(cuArrayCreate_v2(&a, &d2) == 0 && free_now() <= GiB - 256 * MiB,
	      "cuArrayCreate_v2 charged at least its 256Mi: free %zu", free_now());
	CHECK(cuArray3DCreate_v2(&b, &d3) == 0 && free_now() <= GiB - 768 * MiB,
	      "cuArray3DCreate_v2 charged at least its 512Mi: free %zu", free_now());
	size_t before = free_now();
	CHECK(cuMipmappedArrayCreate(&m, &mip, 13) == 0 && before - free_now() >= 42 * MiB,
	      "cuMipmappedArrayCreate charged every level: %zu", before - free_now());
	CHECK(cuArrayCreate_v2(&c, &huge) == CUDA_ERROR_OUT_OF_MEMORY, "an array past the quota");
	CHECK(cuArrayDestroy(a) == 0 && cuArrayDestroy(b) == 0 && cuMipmappedArrayDestroy(m) == 0 &&
	      free_now() == GiB, "destroying them credits exactly: free %zu", free_now());
	CUDA_ARRAY3D_DESCRIPTOR deferred = {16384, 16384, 0, 0x20, 4, CUDA_ARRAY3D_DEFERRED_MAPPING};
	CHECK(cuArray3DCreate_v2(&c, &deferred) == 0 && free_now() == GiB &&
	      cuArrayDestroy(c) == 0, "a deferred-mapping array has no storage of its own");
}

static void limits(void)
{
	CUdeviceptr p = 0;
	CHECK(cuMemAlloc_v2(&p, 600 * MiB) == 0, "600Mi held");
	CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 500 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
	      "a 500Mi device heap does not fit beside 600Mi");
	CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 300 * MiB) == 0 &&
	      free_now() == GiB - 900 * MiB, "a 300Mi heap is charged: free %zu", free_now());
	CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 100 * MiB) == 0 &&
	      free_now() == GiB - 700 * MiB, "setting it again replaces the charge: free %zu",
	      free_now());
	CHECK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 100 * MiB) == 0 &&
	      free_now() == GiB - 800 * MiB, "the printf FIFO is charged: free %zu", free_now());
	/* 1 KiB a thread x 132 multiprocessors x 2048 threads = 264Mi: no room beside 800Mi. */
	CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024) == CUDA_ERROR_OUT_OF_MEMORY,
	      "the stack reservation counts every resident thread");
	CHECK(cuMemFree_v2(p) == 0 && cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024) == 0 &&
	      free_now() == GiB - 200 * MiB - 264 * MiB, "264Mi of stacks charged: free %zu",
	      free_now());
	CHECK(cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4) == 0 &&
	      free_now() == GiB - 464 * MiB, "a limit that reserves no memory passes through");
	CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0) == 0 &&
	      cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0) == 0 &&
	      cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0) == 0 && free_now() == GiB,
	      "all credited: free %zu", free_now());
}

static CUDA_MEM_ALLOC_NODE_PARAMS alloc_node(int type, int id, size_t bytes)
{
	CUDA_MEM_ALLOC_NODE_PARAMS params;
	memset(&params, 0, sizeof(params));
	params.poolProps.allocType = 1;
	params.poolProps.location = (CUmemLocation){type, id};
	params.bytesize = bytes;
	return params;
}

static void graphs(void)
{
	CUgraph graph = NULL;
	CUgraphNode node;
	CHECK(cuGraphCreate(&graph, 0) == 0, "graph");
	CUDA_MEM_ALLOC_NODE_PARAMS a = alloc_node(CU_MEM_LOCATION_TYPE_DEVICE, 0, 600 * MiB);
	CUDA_MEM_ALLOC_NODE_PARAMS b = alloc_node(CU_MEM_LOCATION_TYPE_DEVICE, 0, 600 * MiB);
	CHECK(cuGraphAddMemAllocNode(&node, graph, NULL, 0, &a) == 0 && a.dptr &&
	      free_now() == GiB - 600 * MiB, "a memory allocation node is charged: free %zu",
	      free_now());
	CHECK(cuGraphAddMemAllocNode(&node, graph, NULL, 0, &b) == CUDA_ERROR_OUT_OF_MEMORY,
	      "one past the quota is refused");
	CUgraphNodeParams host;
	memset(&host, 0, sizeof(host));
	host.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
	host.alloc = alloc_node(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0, 800 * MiB);
	CHECK(cuGraphAddNode(&node, graph, NULL, 0, &host) == 0 && free_now() == GiB - 600 * MiB,
	      "a host allocation node is not charged");
	CHECK(cuMemFree_v2(a.dptr) == 0 && free_now() == GiB, "freed outside the graph: credited");

	CUgraphNodeParams on_device = host;
	on_device.alloc = alloc_node(CU_MEM_LOCATION_TYPE_DEVICE, 0, 500 * MiB);
	CHECK(cuGraphAddNode_v2(&node, graph, NULL, NULL, 0, &on_device) == 0 &&
	      free_now() == GiB - 500 * MiB, "cuGraphAddNode_v2 allocation node charged");
	CUgraphNodeParams release;
	memset(&release, 0, sizeof(release));
	release.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
	release.free.dptr = on_device.alloc.dptr;
	CHECK(cuGraphAddNode(&node, graph, NULL, 0, &release) == 0 &&
	      free_now() == GiB - 500 * MiB, "freed inside the graph: charged while it exists");
	CUDA_MEM_ALLOC_NODE_PARAMS c = alloc_node(CU_MEM_LOCATION_TYPE_DEVICE, 0, 300 * MiB);
	CHECK(cuGraphAddMemAllocNode(&node, graph, NULL, 0, &c) == 0 &&
	      cuGraphAddMemFreeNode(&node, graph, NULL, 0, c.dptr) == 0 &&
	      free_now() == GiB - 800 * MiB, "cuGraphAddMemFreeNode: charged while it exists");
	CHECK(cuGraphDestroy(graph) == 0 && free_now() == GiB, "destroying the graph credits: %zu",
	      free_now());
}

static void imported(void)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemGenericAllocationHandle made = 0, got = 0;
	int fd = -1;
	CHECK(cuMemCreate(&made, 600 * MiB, &prop, 0) == 0 &&
	      cuMemExportToShareableHandle(&fd, made, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
					   0) == 0, "600Mi exported");
	CHECK(cuMemImportFromShareableHandle(&got, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0,
	      "imported");
	CHECK(cuMemRelease(made) == 0 && free_now() == GiB, "its creator released it");
	CHECK(cuMemMap(0x100000000ULL, 600 * MiB, 0, got, 0) == 0 &&
	      free_now() == GiB - 600 * MiB, "the importer is charged when it maps it: free %zu",
	      free_now());
	CHECK(cuMemMap(0x200000000ULL, 600 * MiB, 0, got, 0) == 0 &&
	      free_now() == GiB - 600 * MiB, "mapping the same memory twice charges it once");
	CHECK(cuMemRelease(got) == 0 && free_now() == GiB, "releasing the import credits it");

	CUdeviceptr held = 0;
	CHECK(cuMemCreate(&made, 600 * MiB, &prop, 0) == 0 &&
	      cuMemExportToShareableHandle(&fd, made, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
					   0) == 0 &&
	      cuMemImportFromShareableHandle(&got, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 &&
	      cuMemRelease(made) == 0 && cuMemAlloc_v2(&held, 600 * MiB) == 0,
	      "an import held beside 600Mi of our own");
	CHECK(cuMemMap(0x100000000ULL, 600 * MiB, 0, got, 0) == CUDA_ERROR_OUT_OF_MEMORY,
	      "mapping it past the quota is refused");
	CHECK(cuMemRelease(got) == 0 && cuMemFree_v2(held) == 0 && free_now() == GiB, "credited");
}

int main(void)
{
	per_thread_stream();
	arrays();
	limits();
	graphs();
	imported();
	return check_done("paths");
}
