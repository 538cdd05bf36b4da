/* What the CUDA backend's source files share: return codes, the driver library, the current
 * device, where a memory location charges, and one swap function per file for
 * cuGetProcAddress. Each file instantiates the backend for its own rows of symbols.h. */
#ifndef HCS_CUDA_H
#define HCS_CUDA_H

#include "backend.h"
#include "exports.h"

static const char *const cuda_libraries[] = {"libcuda.so.1", "libcuda.so", NULL};
#define HCS_OK_cuda CUDA_SUCCESS
#define HCS_OOM_cuda CUDA_ERROR_OUT_OF_MEMORY
#define HCS_MISSING_cuda CUDA_ERROR_NOT_FOUND
#define HCS_CUDA_HELPERS(Y) Y(cuda, CUresult, cuCtxGetDevice, (CUdevice *device))

/* The backend for `rows`; `helpers` must include HCS_CUDA_HELPERS. */
#define HCS_CUDA_BACKEND(rows, helpers)                                                      \
	HCS_BACKEND(cuda, rows, helpers)                                                     \
	static inline int cuda_ordinal(void)                                                 \
	{                                                                                    \
		CUdevice device = 0;                                                         \
		if (real_cuCtxGetDevice && real_cuCtxGetDevice(&device) == CUDA_SUCCESS)     \
			return device;                                                       \
		return 0;                                                                    \
	}

/* The device a VMM, pool or graph-node location charges, or -1 for host memory (host,
 * host-NUMA, host-NUMA-current: never charged). A type this library does not know is charged
 * to the current device: the driver refuses it, or it is memory we must not miss. */
#define HCS_CUDA_LOCATION_DEVICE(location)                                                   \
	((location)->type == CU_MEM_LOCATION_TYPE_DEVICE ? (location)->id                    \
	 : (location)->type == CU_MEM_LOCATION_TYPE_HOST ||                                  \
			 (location)->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||               \
			 (location)->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT          \
		 ? -1                                                                        \
		 : cuda_ordinal())

/* cuGetProcAddress: the driver's answer is swapped for our hook by address. Each file offers
 * its rows: the hook for a real function of its own, else NULL. */
#define HCS_SWAP_ENTRY(v, ret, name, ...) {(void **)&real_##name, (void *)name},
#define HCS_CUDA_SWAP(function_name, rows)                                                   \
	void *function_name(void *function)                                                  \
	{                                                                                    \
		cuda_ready();                                                                \
		const struct { void **real; void *hook; } table[] = {rows(HCS_SWAP_ENTRY)};  \
		for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)                \
			if (function && *table[i].real == function)                          \
				return table[i].hook;                                        \
		return NULL;                                                                 \
	}
void *hcs_cuda_array_swap(void *function);
void *hcs_cuda_graph_swap(void *function);
void *hcs_cuda_launch_swap(void *function);

#endif
