/* CUDA launches, paced by the compute share (limiter.c): kernels, cooperative kernels, graphs,
 * with and without the per-thread default stream. */
#include <string.h>

#include "cuda.h"
#include "limiter.h"

HCS_CUDA_BACKEND(HCS_SYMBOLS_cuda_launch, HCS_CUDA_HELPERS)
HCS_SYMBOLS_cuda_launch(HCS_DEFINE_HOOK)
HCS_CUDA_SWAP(hcs_cuda_launch_swap, HCS_SYMBOLS_cuda_launch)

/* CUlaunchConfig: {unsigned gridDimX, Y, Z, blockDimX, Y, Z, sharedMemBytes; CUstream hStream;
 * ...}: the stream sits after seven unsigned ints, at offset 32 (8-byte aligned). */
static CUstream config_stream(const void *config)
{
	CUstream stream = NULL;
	if (config)
		memcpy(&stream, (const char *)config + 32, sizeof(stream));
	return stream;
}

CUresult hcs_cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra)
{
	CUstream stream = config_stream(config);
	HCS_LAUNCH_BRACKET(cuda, cuLaunchKernelEx, (config, f, params, extra), stream);
}

CUresult hcs_cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **params, void **extra)
{
	CUstream stream = config_stream(config);
	HCS_LAUNCH_BRACKET(cuda, cuLaunchKernelEx_ptsz, (config, f, params, extra), stream);
}
