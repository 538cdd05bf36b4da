/* Which quota applies to this process, from the outside: EXPECT_LIMIT=<bytes> (that limit on
 * device 0), none (unlimited), or refused (fail closed: every allocation refused with the
 * driver's out-of-memory code, memory info showing no room). */
#include <stdint.h>
#include <string.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

int main(void)
{
	const char *expect = getenv("EXPECT_LIMIT");
	size_t f = 0, t = 0;
	CUdeviceptr p = 0;
	cuMemGetInfo_v2(&f, &t);
	if (!expect) {
		CHECK(0, "EXPECT_LIMIT is not set");
	} else if (!strcmp(expect, "refused")) {
		CHECK(cuMemAlloc_v2(&p, MiB) == CUDA_ERROR_OUT_OF_MEMORY, "1Mi is refused");
		CHECK(cuMemAlloc_v2(&p, 4096) == CUDA_ERROR_OUT_OF_MEMORY, "so is 4Ki");
		CHECK(t == 0 && f == 0, "memory info shows no room: total %zu free %zu", t, f);
	} else if (!strcmp(expect, "none")) {
		CHECK(cuMemAlloc_v2(&p, 2 * GiB) == 0 && cuMemFree_v2(p) == 0, "2Gi is not limited");
	} else {
		size_t limit = (size_t)strtoull(expect, NULL, 10);
		CHECK(t == limit, "total %zu, expected the limit %zu", t, limit);
		CHECK(cuMemAlloc_v2(&p, limit + 1) == CUDA_ERROR_OUT_OF_MEMORY, "over the limit");
		CHECK(cuMemAlloc_v2(&p, limit) == 0 && cuMemFree_v2(p) == 0, "exactly the limit");
	}
	return check_done("quota");
}
