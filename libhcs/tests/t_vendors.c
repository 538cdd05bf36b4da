/* HIP, ACL, the Ascend runtime, CNRT and CNDrv through dlopen: each refuses with its own
 * out-of-memory code and reports the quota in its memory-info call. HCS_VRAM_QUOTA=1Gi. */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"


typedef int alloc2_t(void **, size_t);
typedef int free1_t(void *);
typedef int info_t(size_t *, size_t *);

static void exercise(const char *library, const char *alloc_name, const char *free_name,
		     const char *info_name, int oom, int info_takes_attr)
{
	void *lib = dlopen(library, RTLD_NOW);
	CHECK(lib != NULL, "%s: %s", library, dlerror());
	if (!lib)
		return;
	void *alloc = dlsym(lib, alloc_name), *release = dlsym(lib, free_name);
	void *a = NULL, *b = NULL;
	int rc1, rc2;
	if (!strcmp(alloc_name, "aclrtMalloc")) {
		rc1 = ((int (*)(void **, size_t, int))alloc)(&a, 700 * MiB, 0);
		rc2 = ((int (*)(void **, size_t, int))alloc)(&b, 700 * MiB, 0);
	} else if (!strcmp(alloc_name, "rtMalloc")) {
		rc1 = ((int (*)(void **, uint64_t, int, uint16_t))alloc)(&a, 700 * MiB, 0, 0);
		rc2 = ((int (*)(void **, uint64_t, int, uint16_t))alloc)(&b, 700 * MiB, 0, 0);
	} else if (!strcmp(alloc_name, "cnMalloc")) {
		rc1 = ((int (*)(uint64_t *, uint64_t))alloc)((uint64_t *)&a, 700 * MiB);
		rc2 = ((int (*)(uint64_t *, uint64_t))alloc)((uint64_t *)&b, 700 * MiB);
	} else {
		rc1 = ((alloc2_t *)alloc)(&a, 700 * MiB);
		rc2 = ((alloc2_t *)alloc)(&b, 700 * MiB);
	}
	CHECK(rc1 == 0, "%s within quota: %d", alloc_name, rc1);
	CHECK(rc2 == oom, "%s over quota returns %d, got %d", alloc_name, oom, rc2);
	if (info_name) {
		size_t f = 0, t = 0;
		void *info = dlsym(lib, info_name);
		int rc = info_takes_attr ? ((int (*)(int, size_t *, size_t *))info)(0, &f, &t)
					 : ((info_t *)info)(&f, &t);
		CHECK(rc == 0 && t == GiB && f == GiB - 700 * MiB, "%s total %zu free %zu", info_name,
		      t, f);
	}
	int rc = !strcmp(free_name, "cnFree") ? ((int (*)(uint64_t))release)((uint64_t)(uintptr_t)a)
					      : ((free1_t *)release)(a);
	CHECK(rc == 0, "%s", free_name);
}

int main(void)
{
	exercise("libamdhip64.so", "hipMalloc", "hipFree", "hipMemGetInfo", hipErrorOutOfMemory, 0);
	exercise("libascendcl.so", "aclrtMalloc", "aclrtFree", "aclrtGetMemInfo",
		 ACL_ERROR_RT_MEMORY_ALLOCATION, 1);
	exercise("libruntime.so", "rtMalloc", "rtFree", "rtMemGetInfoEx",
		 ACL_ERROR_RT_MEMORY_ALLOCATION, 1);
	exercise("libcnrt.so", "cnrtMalloc", "cnrtFree", "cnrtMemGetInfo", CNRT_RET_ERR_NOMEM, 0);
	exercise("libcndrv.so", "cnMalloc", "cnFree", NULL, CN_MEMORY_ERROR_OUT_OF_MEMORY, 0);
	return check_done("vendors");
}
