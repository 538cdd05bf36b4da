/* libhcs against a real CUDA driver (run by bench/gpu/run.py on a machine with an NVIDIA GPU).
 *
 *   real_cuda quota GIB GIB...  allocate each size in turn on device 0 and print the driver's
 *                               answer per allocation, then cuMemGetInfo; frees everything.
 *                               REAL_CUDA_HOLD_SECONDS=S keeps them S seconds before freeing.
 *   real_cuda pairs N R         median ns per cuMemAlloc_v2(4 KiB) + cuMemFree_v2 pair over R
 *                               rounds of N pairs (run with and without libhcs preloaded).
 *
 * The driver is opened with dlopen + dlsym, as the CUDA runtime and the frameworks do, so
 * the calls reach libhcs through its dlsym hook; no CUDA headers are needed (the few types
 * come from libhcs/include/hcs_abi.h, which follows cuda.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hcs_abi.h"

typedef void *CUcontext;
static CUresult (*cu_init)(unsigned int);
static CUresult (*cu_device_get)(CUdevice *, int);
static CUresult (*cu_retain)(CUcontext *, CUdevice);
static CUresult (*cu_set_current)(CUcontext);
static CUresult (*cu_alloc)(CUdeviceptr *, size_t);
static CUresult (*cu_free)(CUdeviceptr);
static CUresult (*cu_info)(size_t *, size_t *);

static void *need(void *lib, const char *name)
{
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "real_cuda: %s not found\n", name);
		exit(2);
	}
	return f;
}

static int compare(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		fprintf(stderr, "real_cuda: %s\n", dlerror());
		return 2;
	}
	cu_init = need(lib, "cuInit");
	cu_device_get = need(lib, "cuDeviceGet");
	cu_retain = need(lib, "cuDevicePrimaryCtxRetain");
	cu_set_current = need(lib, "cuCtxSetCurrent");
	cu_alloc = need(lib, "cuMemAlloc_v2");
	cu_free = need(lib, "cuMemFree_v2");
	cu_info = need(lib, "cuMemGetInfo_v2");
	CUdevice dev;
	CUcontext ctx;
	if (cu_init(0) || cu_device_get(&dev, 0) || cu_retain(&ctx, dev) || cu_set_current(ctx)) {
		fprintf(stderr, "real_cuda: no context on device 0\n");
		return 2;
	}
	if (strcmp(argv[1], "quota") == 0) {
		CUdeviceptr held[16];
		int n = 0;
		for (int i = 2; i < argc && n < 16; i++) {
			size_t bytes = (size_t)atol(argv[i]) << 30;
			CUdeviceptr p = 0;
			CUresult rc = cu_alloc(&p, bytes);
			printf("alloc %sGiB rc=%d\n", argv[i], rc);
			if (rc == CUDA_SUCCESS)
				held[n++] = p;
		}
		size_t free_b = 0, total_b = 0;
		CUresult rc = cu_info(&free_b, &total_b);
		printf("meminfo rc=%d free=%zu total=%zu\n", rc, free_b, total_b);
		fflush(stdout);
		const char *hold = getenv("REAL_CUDA_HOLD_SECONDS"); /* keep the memory while a peer tries */
		if (hold)
			sleep((unsigned)atoi(hold));
		while (n > 0)
			cu_free(held[--n]);
		return 0;
	}
	long pairs = atol(argv[2]);
	int rounds = argc > 3 ? atoi(argv[3]) : 9;
	double ns[64];
	CUdeviceptr p;
	for (int r = 0; r < rounds && r < 64; r++) {
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		for (long i = 0; i < pairs; i++) {
			if (cu_alloc(&p, 4096) || cu_free(p))
				return 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &b);
		ns[r] = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / pairs;
	}
	qsort(ns, rounds, sizeof(double), compare);
	printf("%.1f\n", ns[rounds / 2]);
	return 0;
}
