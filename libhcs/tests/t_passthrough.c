/* Without a usable quota, libhcs must stay out of the way: 2 GiB allocates and frees. */
#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

int main(void)
{
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, 2 * GiB) == 0, "not limited");
	CHECK(cuMemFree_v2(p) == 0, "free");
	return check_done("passthrough");
}
