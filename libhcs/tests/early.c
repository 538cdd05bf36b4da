#include "../include/hcs_abi.h"
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
__attribute__((visibility("default"))) CUdeviceptr early_pointer;
__attribute__((constructor)) static void early(void) { cuMemAlloc_v2(&early_pointer, 100 << 20); }
