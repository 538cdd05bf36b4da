/* Calls that reach the driver by name: dlopen + dlsym, and cuGetProcAddress (v1 and v2), as
 * cudart 12 does. Run with HCS_VRAM_QUOTA=1Gi and libhcs preloaded. */
#include <dlfcn.h>

#include "../include/hcs_abi.h"
#include "check.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc2_fn)(const char *, void **, int, cuuint64_t, int *);

int main(void)
{
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CHECK(cuda != NULL, "dlopen libcuda.so.1: %s", dlerror());
	if (!cuda)
		return check_done("lookup");
	alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
	free_fn release = (free_fn)dlsym(cuda, "cuMemFree_v2");
	CUdeviceptr a, b;
	CHECK(alloc(&a, 700 * MiB) == 0, "dlsym'd alloc works");
	CHECK(alloc(&b, 700 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "dlsym'd alloc is limited");
	CHECK(release(a) == 0, "dlsym'd free");

	proc_fn get = (proc_fn)dlsym(cuda, "cuGetProcAddress");
	void *fn = NULL;
	CHECK(get("cuMemAlloc", &fn, 12000, 0) == 0 && fn, "cuGetProcAddress resolves cuMemAlloc");
	alloc = (alloc_fn)fn;
	CHECK(alloc(&a, 700 * MiB) == 0, "proc-address alloc works");
	CHECK(alloc(&b, 700 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "proc-address alloc is limited");
	CHECK(get("cuMemFree", &fn, 12000, 0) == 0, "cuGetProcAddress resolves cuMemFree");
	CHECK(((free_fn)fn)(a) == 0, "proc-address free credits");
	proc2_fn get2 = (proc2_fn)dlsym(cuda, "cuGetProcAddress_v2");
	int status = -1;
	CHECK(get2("cuMemAlloc", &fn, 12000, 0, &status) == 0 && status == 0, "v2 resolves");
	CHECK(((alloc_fn)fn)(&a, 1100 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "v2 alloc is limited");
	CHECK(get("cuCtxGetDevice", &fn, 12000, 0) == 0 && fn == dlsym(cuda, "cuCtxGetDevice"),
	      "unhooked names are the driver's own");
	void *next = dlsym(RTLD_NEXT, "malloc");
	CHECK(next != NULL, "RTLD_NEXT lookups still resolve relative to the caller");
	return check_done("lookup");
}
