/*
 * A workload that allocates device memory through a vendor's own API, found the way the
 * vendor's runtime finds its driver (dlopen by the library's name, dlsym), for the tests of
 * a whole node: the container gets the library from the host's driver directory and libhcs
 * through /etc/ld.so.preload, so what this prints is what an application would see.
 *
 *   alloc_app cuda|acl [--hold] MIB...
 *
 * Prints `libhcs mapped: yes|no` (from /proc/self/maps), then one line per allocation,
 * `alloc MIB MiB: ok` or `alloc MIB MiB: refused (code N)` with the API's own error code
 * (CUDA_ERROR_OUT_OF_MEMORY is 2, ACL_ERROR_RT_MEMORY_ALLOCATION 207001); with --hold it then
 * prints `holding` and keeps its memory until a signal, as a training job holds its tensors.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*alloc_fn)(void **, size_t);

static int (*cu_alloc)(unsigned long long *, size_t);
static int (*acl_alloc)(void **, size_t, int);

static int cuda_alloc_v2(void **ptr, size_t size)
{
	unsigned long long device_ptr = 0;
	int code = cu_alloc(&device_ptr, size);
	*ptr = (void *)(unsigned long)device_ptr;
	return code;
}

static int acl_alloc_huge_first(void **ptr, size_t size)
{
	return acl_alloc(ptr, size, 0); /* ACL_MEM_MALLOC_HUGE_FIRST */
}

static int libhcs_mapped(void)
{
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[4096];
	int found = 0;
	if (!maps)
		return 0;
	while (!found && fgets(line, sizeof(line), maps))
		found = strstr(line, "/libhcs.so") != NULL;
	fclose(maps);
	return found;
}

static alloc_fn open_vendor(const char *vendor)
{
	if (strcmp(vendor, "cuda") == 0) {
		void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
		int (*init)(unsigned int) = lib ? (int (*)(unsigned int))dlsym(lib, "cuInit") : NULL;
		cu_alloc = lib ? (int (*)(unsigned long long *, size_t))dlsym(lib, "cuMemAlloc_v2")
			       : NULL;
		if (!init || !cu_alloc || init(0) != 0)
			return NULL;
		return cuda_alloc_v2;
	}
	if (strcmp(vendor, "acl") == 0) {
		void *lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_GLOBAL);
		int (*set_device)(int) = lib ? (int (*)(int))dlsym(lib, "aclrtSetDevice") : NULL;
		acl_alloc = lib ? (int (*)(void **, size_t, int))dlsym(lib, "aclrtMalloc") : NULL;
		if (!acl_alloc)
			return NULL;
		if (set_device && set_device(0) != 0)
			return NULL;
		return acl_alloc_huge_first;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s cuda|acl [--hold] MIB...\n", argv[0]);
		return 2;
	}
	alloc_fn alloc = open_vendor(argv[1]);
	if (!alloc) {
		const char *why = dlerror();
		fprintf(stderr, "alloc_app: no %s driver: %s\n", argv[1], why ? why : "init failed");
		return 1;
	}
	int first = 2, hold = 0;
	if (strcmp(argv[2], "--hold") == 0) {
		hold = 1;
		first = 3;
	}
	printf("libhcs mapped: %s\n", libhcs_mapped() ? "yes" : "no");
	for (int i = first; i < argc; i++) {
		unsigned long long mib = strtoull(argv[i], NULL, 10);
		void *ptr = NULL;
		int code = alloc(&ptr, (size_t)mib << 20);
		if (code == 0)
			printf("alloc %llu MiB: ok\n", mib);
		else
			printf("alloc %llu MiB: refused (code %d)\n", mib, code);
	}
	if (hold) {
		printf("holding\n");
		fflush(stdout);
		for (;;)
			pause();
	}
	return 0;
}
