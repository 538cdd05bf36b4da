/* CUDA through direct linking: quota hits, memory info, every allocation kind, exact
 * crediting of frees, unknown pointers passed through. Run with HCS_VRAM_QUOTA=1Gi. */
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const void *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
void fakeSetDevice(int);

static size_t free_now(void)
{
	size_t f = 0, t = 0;
	cuMemGetInfo_v2(&f, &t);
	return f;
}

int main(void)
{
	CUdeviceptr a = 0, b = 0, c = 0, d = 0, e = 0, p = 0;
	size_t f, t, pitch = 0;
	CHECK(cuMemGetInfo_v2(&f, &t) == 0 && t == GiB && f == GiB, "info total=%zu free=%zu", t, f);
	CHECK(cuMemAlloc_v2(&a, 600 * MiB) == CUDA_SUCCESS, "600Mi fits");
	CHECK(cuMemAlloc_v2(&b, 600 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "second 600Mi is refused");
	CHECK(free_now() == GiB - 600 * MiB, "free shows the quota left: %zu", free_now());
	CHECK(cuMemAllocManaged(&b, 100 * MiB, 1) == 0, "managed counts");
	CHECK(cuMemAllocAsync(&c, 100 * MiB, NULL) == 0, "async counts");
	CHECK(cuMemAllocFromPoolAsync(&d, 100 * MiB, NULL, NULL) == 0, "pool counts");
	CHECK(free_now() == GiB - 900 * MiB, "all four counted: free %zu", free_now());
	CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 1000, 4) == 0 && pitch == 1024, "pitch");
	CHECK(free_now() == GiB - 900 * MiB - 1024 * 1000, "pitched counted at pitch x height");
	CUmemGenericAllocationHandle h = 0;
	int prop[8] = {1, 0, 1, 0, 0, 0, 0, 0}; /* type, handle types, location {device, id 0} */
	CHECK(cuMemCreate(&h, 200 * MiB, prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "VMM over quota");
	CHECK(cuMemCreate(&h, 50 * MiB, prop, 0) == 0, "VMM within quota");
	CHECK(cuMemRelease(h) == 0, "VMM release");
	CHECK(cuMemFree_v2(a) == 0 && cuMemFreeAsync(b, NULL) == 0 && cuMemFree_v2(c) == 0 &&
	      cuMemFree_v2(d) == 0 && cuMemFree_v2(p) == 0, "frees");
	CHECK(free_now() == GiB, "everything credited back exactly: free %zu", free_now());
	CHECK(cuMemFree_v2(a) == CUDA_ERROR_INVALID_VALUE, "double free passes through");
	CHECK(cuMemFree_v2(0x1234) == CUDA_ERROR_INVALID_VALUE, "unknown pointer passes through");
	CHECK(free_now() == GiB, "no underflow after bad frees: free %zu", free_now());
	CHECK(cuMemAlloc_v2(&e, GiB + 1) == CUDA_ERROR_OUT_OF_MEMORY, "larger than the quota");
	CHECK(cuMemAlloc_v2(&e, GiB) == 0 && cuMemFree_v2(e) == 0, "exactly the quota");
	fakeSetDevice(1); /* every device has its own limit with HCS_VRAM_QUOTA */
	CHECK(cuMemAlloc_v2(&a, 900 * MiB) == 0, "device 1 has its own quota");
	fakeSetDevice(0);
	CHECK(cuMemAlloc_v2(&b, 900 * MiB) == 0, "device 0 unaffected by device 1");
	return check_done("cuda-direct");
}
