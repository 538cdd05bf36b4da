/* A library whose constructor allocates before main (and possibly before libhcs's own
 * constructor finished elsewhere): the allocation is still counted. */
#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemGetInfo_v2(size_t *, size_t *);
extern CUdeviceptr early_pointer;

int main(void)
{
	size_t f, t;
	cuMemGetInfo_v2(&f, &t);
	CHECK(early_pointer != 0, "the constructor allocated");
	CHECK(f == GiB - 100 * MiB, "its 100Mi is counted: free %zu", f);
	return check_done("constructor");
}
