/* A fake libcuda.so.1 following the driver ABI for the calls libhcs hooks, plus
 * cuCtxGetDevice/cuCtxSetCurrent-style device selection (fakeSetDevice) and
 * cuGetProcAddress with the driver's versioned-name resolution. */
#include <string.h>

#include "../../include/hcs_abi.h"
#include "fake_memory.h"

FAKE_API void fakeSetDevice(int device) { fake_current_device = device; }
FAKE_API CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
FAKE_API CUresult cuCtxGetDevice(CUdevice *device) { *device = fake_current_device; return 0; }

#define ALLOC_OR_OOM(ptr, size) \
	uint64_t key; if (fake_alloc(size, 0, &key)) return CUDA_ERROR_OUT_OF_MEMORY; \
	*(ptr) = key; return CUDA_SUCCESS

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t s) { ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t s, unsigned int f) { (void)f; ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t s, CUstream st) { (void)st; ALLOC_OR_OOM(p, s); }
FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t s, CUstream st) { (void)st; ALLOC_OR_OOM(p, s); }
/* Memory pools: a pool remembers its location; allocations from it land there. */
struct fake_pool { CUmemLocation location; };
static struct fake_pool default_pools[FAKE_DEVICES];

static int fake_location_device(const CUmemLocation *location)
{
	switch (location->type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		return location->id >= 0 && location->id < FAKE_DEVICES ? location->id : -2;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
		return -1;
	default:
		return -2; /* invalid */
	}
}

FAKE_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	if (!pool || !props || fake_location_device(&props->location) < -1)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_pool *created = malloc(sizeof(*created));
	if (!created)
		return CUDA_ERROR_OUT_OF_MEMORY;
	created->location = props->location;
	*pool = created;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	free(pool);
	return CUDA_SUCCESS;
}
static CUresult default_pool(CUmemoryPool *pool, CUdevice device)
{
	if (!pool || device < 0 || device >= FAKE_DEVICES)
		return CUDA_ERROR_INVALID_VALUE;
	default_pools[device].location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, device};
	*pool = &default_pools[device];
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device)
{
	return default_pool(pool, device);
}
FAKE_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice device)
{
	return default_pool(pool, device);
}
FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t s, CUmemoryPool pool, CUstream st)
{
	(void)st;
	int device = pool ? fake_location_device(&((struct fake_pool *)pool)->location)
			  : fake_current_device;
	uint64_t key;
	if (fake_alloc_on(device, s, 0, &key))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t s, CUmemoryPool pool,
					       CUstream st)
{
	return cuMemAllocFromPoolAsync(p, s, pool, st);
}
FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
	(void)e;
	*pitch = (w + 511) & ~(size_t)511;
	ALLOC_OR_OOM(p, *pitch * h);
}
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p, 0) ? CUDA_ERROR_INVALID_VALUE : 0; }
FAKE_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream st) { (void)st; return cuMemFree_v2(p); }
FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream st) { (void)st; return cuMemFree_v2(p); }
/* As the driver: the allocation lands where prop->location says (host types are host memory). */
FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t s,
			      const CUmemAllocationProp *prop, unsigned long long f)
{
	(void)f;
	int device = prop ? fake_location_device(&prop->location) : -2;
	if (device < -1)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t key;
	if (fake_alloc_on(device, s, 1, &key)) return CUDA_ERROR_OUT_OF_MEMORY;
	*h = key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fake_free(h, 1) ? CUDA_ERROR_INVALID_VALUE : 0; }
FAKE_API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { fake_info(f, t); return CUDA_SUCCESS; }

/* Kernels and events on one device timeline: a launch occupies FAKE_KERNEL_US of device time
 * after whatever is queued; the queue holds two kernels, after which launching blocks (as a
 * real driver's does when its queue is full). Events take the timeline's time when recorded. */
#include <time.h>
typedef void *CUevent;
struct fake_event { long long ts; };
static long long timeline_end, busy_total;
static pthread_mutex_t timeline_lock = PTHREAD_MUTEX_INITIALIZER;

static long long fake_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static CUresult fake_launch(void)
{
	const char *text = getenv("FAKE_KERNEL_US");
	long long duration = (text ? atoll(text) : 1000) * 1000;
	pthread_mutex_lock(&timeline_lock);
	long long now = fake_now();
	long long start = timeline_end > now ? timeline_end : now;
	timeline_end = start + duration;
	busy_total += duration;
	long long wait = timeline_end - now - 2 * duration;
	pthread_mutex_unlock(&timeline_lock);
	if (wait > 0) {
		struct timespec pause = {wait / 1000000000LL, wait % 1000000000LL};
		nanosleep(&pause, NULL);
	}
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
				 unsigned int bx, unsigned int by, unsigned int bz,
				 unsigned int shared, CUstream stream, void **params, void **extra)
{
	(void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared;
	(void)stream; (void)params; (void)extra;
	return fake_launch();
}
FAKE_API CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra)
{
	(void)config; (void)f; (void)params; (void)extra;
	return fake_launch();
}
FAKE_API CUresult cuGraphLaunch(void *graph, CUstream stream)
{
	(void)graph; (void)stream;
	return fake_launch();
}
FAKE_API CUresult cuLaunchCooperativeKernel(void *f, unsigned int gx, unsigned int gy,
					    unsigned int gz, unsigned int bx, unsigned int by,
					    unsigned int bz, unsigned int shared, CUstream stream,
					    void **params)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
/* The per-thread-default-stream entry points behave the same on the fake's one timeline. */
FAKE_API CUresult cuLaunchKernel_ptsz(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
				      unsigned int bx, unsigned int by, unsigned int bz,
				      unsigned int shared, CUstream stream, void **params,
				      void **extra)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
FAKE_API CUresult cuLaunchKernelEx_ptsz(const void *config, void *f, void **params, void **extra)
{
	return cuLaunchKernelEx(config, f, params, extra);
}
FAKE_API CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned int gx, unsigned int gy,
						 unsigned int gz, unsigned int bx, unsigned int by,
						 unsigned int bz, unsigned int shared,
						 CUstream stream, void **params)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
FAKE_API CUresult cuGraphLaunch_ptsz(void *graph, CUstream stream)
{
	return cuGraphLaunch(graph, stream);
}
FAKE_API CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
	(void)flags;
	*event = calloc(1, sizeof(struct fake_event));
	return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_API CUresult cuEventDestroy_v2(CUevent event) { free(event); return CUDA_SUCCESS; }
FAKE_API CUresult cuEventRecord(CUevent event, CUstream stream)
{
	(void)stream;
	pthread_mutex_lock(&timeline_lock);
	long long now = fake_now();
	((struct fake_event *)event)->ts = timeline_end > now ? timeline_end : now;
	pthread_mutex_unlock(&timeline_lock);
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuEventQuery(CUevent event)
{
	return fake_now() >= ((struct fake_event *)event)->ts ? CUDA_SUCCESS : 600;
}
FAKE_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
	*ms = (float)(((struct fake_event *)end)->ts - ((struct fake_event *)start)->ts) / 1e6f;
	return CUDA_SUCCESS;
}
/* For tests: device time used so far and when the timeline ends. */
FAKE_API long long fakeBusyNanos(void) { return busy_total; }
FAKE_API long long fakeTimelineEnd(void) { return timeline_end; }
FAKE_API long long fakeNow(void) { return fake_now(); }

/* Arrays: storage of width x height x depth elements (every mipmap level), as handles. */
static uint64_t fake_element(int format, unsigned int channels)
{
	int bytes = format == 0x01 || format == 0x08 ? 1 : format == 0x02 || format == 0x09 ||
			format == 0x10 ? 2 : 4;
	return (uint64_t)bytes * (channels ? channels : 1);
}
static uint64_t fake_array_size(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	uint64_t total = 0;
	for (unsigned int l = 0; l < (levels ? levels : 1); l++) {
		uint64_t w = d->Width >> l ? d->Width >> l : 1, h = d->Height >> l ? d->Height >> l : 1;
		uint64_t z = d->Depth >> l ? d->Depth >> l : 1;
		total += w * h * z * fake_element(d->Format, d->NumChannels);
	}
	return total;
}
static CUresult fake_array(void **out, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	uint64_t key;
	if (!out || !d || !d->Width)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_alloc(fake_array_size(d, levels), 1, &key))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = (void *)(uintptr_t)key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR as3d = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
	return fake_array(a, &as3d, 1);
}
FAKE_API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	return fake_array(a, d, 1);
}
FAKE_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d,
					 unsigned int levels)
{
	return fake_array(a, d, levels);
}
FAKE_API CUresult cuArrayDestroy(CUarray a)
{
	return fake_free((uint64_t)(uintptr_t)a, 1) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
FAKE_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return cuArrayDestroy(a); }

/* A device of 132 multiprocessors with 2048 resident threads each (an H100's figures). */
FAKE_API CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device)
{
	if (!value || device < 0 || device >= FAKE_DEVICES)
		return CUDA_ERROR_INVALID_VALUE;
	*value = attribute == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132
	       : attribute == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR ? 2048 : 0;
	return CUDA_SUCCESS;
}

/* Limits that reserve memory hold it as a block per (device, limit), replaced when set again. */
static uint64_t limit_blocks[FAKE_DEVICES][3];
FAKE_API CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	int device = fake_current_device;
	if (limit < 0 || limit > 8)
		return CUDA_ERROR_INVALID_VALUE;
	if (limit > CU_LIMIT_MALLOC_HEAP_SIZE)
		return CUDA_SUCCESS;
	uint64_t bytes = limit == CU_LIMIT_STACK_SIZE ? (uint64_t)value * 132 * 2048 : value;
	uint64_t key = 0, old = limit_blocks[device][limit];
	if (old)
		fake_free(old, 1);
	if (bytes && fake_alloc(bytes, 1, &key)) {
		limit_blocks[device][limit] = 0;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	limit_blocks[device][limit] = key;
	return CUDA_SUCCESS;
}

/* Graphs: allocation nodes allocate where their pool says when added (the address is fixed
 * then); a graph frees what its free nodes name when it is destroyed. */
struct fake_graph { CUdeviceptr frees[64]; int count; };
FAKE_API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
	(void)flags;
	*graph = calloc(1, sizeof(struct fake_graph));
	return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
					 size_t count, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
	(void)deps; (void)count;
	if (!node || !graph || !params)
		return CUDA_ERROR_INVALID_VALUE;
	int device = fake_location_device(&params->poolProps.location);
	uint64_t key;
	if (device < -1)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_alloc_on(device, params->bytesize, 0, &key))
		return CUDA_ERROR_OUT_OF_MEMORY;
	params->dptr = key;
	*node = (CUgraphNode)(uintptr_t)key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
					size_t count, CUdeviceptr dptr)
{
	(void)deps; (void)count;
	struct fake_graph *g = graph;
	if (!node || !g || g->count == 64 || fake_device_of(dptr) < -1)
		return CUDA_ERROR_INVALID_VALUE;
	g->frees[g->count++] = dptr;
	*node = (CUgraphNode)(uintptr_t)dptr;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
				 size_t count, CUgraphNodeParams *params)
{
	if (!params)
		return CUDA_ERROR_INVALID_VALUE;
	if (params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		return cuGraphAddMemAllocNode(node, graph, deps, count, &params->alloc);
	if (params->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
		return cuGraphAddMemFreeNode(node, graph, deps, count, params->free.dptr);
	*node = (CUgraphNode)graph;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
				    const CUgraphEdgeData *edges, size_t count,
				    CUgraphNodeParams *params)
{
	(void)edges;
	return cuGraphAddNode(node, graph, deps, count, params);
}
FAKE_API CUresult cuGraphDestroy(CUgraph graph)
{
	struct fake_graph *g = graph;
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < g->count; i++)
		fake_free(g->frees[i], 0);
	free(g);
	return CUDA_SUCCESS;
}

/* Shareable handles: the exported "file descriptor" names the handle; importing it gives a
 * new handle to the same memory. */
FAKE_API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
					       CUmemAllocationHandleType type,
					       unsigned long long flags)
{
	(void)flags;
	if (!shareable || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fake_device_of(h) < -1)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)shareable = (int)h;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
						 CUmemAllocationHandleType type)
{
	uint64_t key;
	if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
	    fake_alias((uint64_t)(uintptr_t)os_handle, &key))
		return CUDA_ERROR_INVALID_VALUE;
	*h = key;
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							 CUmemGenericAllocationHandle h)
{
	int device = fake_device_of(h);
	if (!prop || device < -1)
		return CUDA_ERROR_INVALID_VALUE;
	memset(prop, 0, sizeof(*prop));
	prop->type = 1;
	prop->location = device >= 0 ? (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, device}
				     : (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
	return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			   CUmemGenericAllocationHandle h, unsigned long long flags)
{
	(void)ptr; (void)size; (void)offset; (void)flags;
	return fake_device_of(h) < -1 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* The driver appends _v2 to names whose ABI changed when the version asks for it, and gives
 * the per-thread-default-stream entry point when the flags ask for it. */
FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	static const struct { const char *name; void *v1; void *v2; void *ptsz; } table[] = {
		{"cuMemAlloc", NULL, (void *)cuMemAlloc_v2, NULL},
		{"cuMemAllocPitch", NULL, (void *)cuMemAllocPitch_v2, NULL},
		{"cuMemFree", NULL, (void *)cuMemFree_v2, NULL},
		{"cuMemGetInfo", NULL, (void *)cuMemGetInfo_v2, NULL},
		{"cuMemAllocManaged", (void *)cuMemAllocManaged, NULL, NULL},
		{"cuMemAllocAsync", (void *)cuMemAllocAsync, NULL, (void *)cuMemAllocAsync_ptsz},
		{"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, NULL,
		 (void *)cuMemAllocFromPoolAsync_ptsz},
		{"cuMemFreeAsync", (void *)cuMemFreeAsync, NULL, (void *)cuMemFreeAsync_ptsz},
		{"cuMemCreate", (void *)cuMemCreate, NULL, NULL},
		{"cuMemPoolCreate", (void *)cuMemPoolCreate, NULL, NULL},
		{"cuMemPoolDestroy", (void *)cuMemPoolDestroy, NULL, NULL},
		{"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool, NULL, NULL},
		{"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool, NULL, NULL},
		{"cuMemRelease", (void *)cuMemRelease, NULL, NULL},
		{"cuMemMap", (void *)cuMemMap, NULL, NULL},
		{"cuMemImportFromShareableHandle", (void *)cuMemImportFromShareableHandle, NULL, NULL},
		{"cuMemExportToShareableHandle", (void *)cuMemExportToShareableHandle, NULL, NULL},
		{"cuArrayCreate", NULL, (void *)cuArrayCreate_v2, NULL},
		{"cuArray3DCreate", NULL, (void *)cuArray3DCreate_v2, NULL},
		{"cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate, NULL, NULL},
		{"cuArrayDestroy", (void *)cuArrayDestroy, NULL, NULL},
		{"cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy, NULL, NULL},
		{"cuCtxSetLimit", (void *)cuCtxSetLimit, NULL, NULL},
		{"cuCtxGetDevice", (void *)cuCtxGetDevice, NULL, NULL},
		{"cuGraphCreate", (void *)cuGraphCreate, NULL, NULL},
		{"cuGraphAddMemAllocNode", (void *)cuGraphAddMemAllocNode, NULL, NULL},
		{"cuGraphAddMemFreeNode", (void *)cuGraphAddMemFreeNode, NULL, NULL},
		{"cuGraphAddNode", (void *)cuGraphAddNode, (void *)cuGraphAddNode_v2, NULL},
		{"cuGraphDestroy", (void *)cuGraphDestroy, NULL, NULL},
		{"cuLaunchKernel", (void *)cuLaunchKernel, NULL, (void *)cuLaunchKernel_ptsz},
		{"cuLaunchKernelEx", (void *)cuLaunchKernelEx, NULL, (void *)cuLaunchKernelEx_ptsz},
		{"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel, NULL,
		 (void *)cuLaunchCooperativeKernel_ptsz},
		{"cuGraphLaunch", (void *)cuGraphLaunch, NULL, (void *)cuGraphLaunch_ptsz},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].name, symbol) == 0) {
			int v2_from = strcmp(symbol, "cuGraphAddNode") == 0 ? 12040 : 3020;
			*pfn = (version >= v2_from && table[i].v2) ? table[i].v2 : table[i].v1;
			if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && table[i].ptsz)
				*pfn = table[i].ptsz;
			return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
		}
	*pfn = NULL;
	return CUDA_ERROR_NOT_FOUND;
}
FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
				      cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	CUresult rc = cuGetProcAddress(symbol, pfn, version, flags);
	if (status) *status = rc == CUDA_SUCCESS ? 0 : 1;
	return rc;
}
