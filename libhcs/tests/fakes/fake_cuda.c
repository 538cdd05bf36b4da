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
FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
	(void)e;
	*pitch = (w + 511) & ~(size_t)511;
	ALLOC_OR_OOM(p, *pitch * h);
}
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p, 0) ? CUDA_ERROR_INVALID_VALUE : 0; }
FAKE_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream st) { (void)st; return cuMemFree_v2(p); }
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

FAKE_API CUresult cuLaunchKernel(void *, unsigned int, unsigned int, unsigned int, unsigned int,
				 unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
FAKE_API CUresult cuGraphLaunch(void *, CUstream);

/* The driver appends _v2 to names whose ABI changed when the version asks for it. */
FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	(void)flags;
	static const struct { const char *name; void *v1; void *v2; } table[] = {
		{"cuMemAlloc", NULL, (void *)cuMemAlloc_v2},
		{"cuMemAllocPitch", NULL, (void *)cuMemAllocPitch_v2},
		{"cuMemFree", NULL, (void *)cuMemFree_v2},
		{"cuMemGetInfo", NULL, (void *)cuMemGetInfo_v2},
		{"cuMemAllocManaged", (void *)cuMemAllocManaged, NULL},
		{"cuMemAllocAsync", (void *)cuMemAllocAsync, NULL},
		{"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, NULL},
		{"cuMemFreeAsync", (void *)cuMemFreeAsync, NULL},
		{"cuMemCreate", (void *)cuMemCreate, NULL},
		{"cuMemPoolCreate", (void *)cuMemPoolCreate, NULL},
		{"cuMemPoolDestroy", (void *)cuMemPoolDestroy, NULL},
		{"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool, NULL},
		{"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool, NULL},
		{"cuMemRelease", (void *)cuMemRelease, NULL},
		{"cuCtxGetDevice", (void *)cuCtxGetDevice, NULL},
		{"cuLaunchKernel", (void *)cuLaunchKernel, NULL},
		{"cuGraphLaunch", (void *)cuGraphLaunch, NULL},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].name, symbol) == 0) {
			*pfn = (version >= 3020 && table[i].v2) ? table[i].v2 : table[i].v1;
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
