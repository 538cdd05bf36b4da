/* CUDA memory the allocation calls do not cover: arrays (texture and surface storage) and the
 * context limits that reserve device memory (device-side malloc heap, printf FIFO, per-thread
 * stacks). Each is charged before the driver gets the call and credited when it is destroyed
 * or set again. */
#include "cuda.h"

#define ARRAY_HELPERS(Y)                                                                     \
	HCS_CUDA_HELPERS(Y)                                                                  \
	Y(cuda, CUresult, cuDeviceGetAttribute, (int *value, int attribute, CUdevice device))

HCS_CUDA_BACKEND(HCS_SYMBOLS_cuda_array, ARRAY_HELPERS)
HCS_SYMBOLS_cuda_array(HCS_DEFINE_HOOK)
HCS_CUDA_SWAP(hcs_cuda_array_swap, HCS_SYMBOLS_cuda_array)

CUresult hcs_cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	cuda_ready();
	if (!real_cuArrayCreate_v2)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing() || !desc)
		return real_cuArrayCreate_v2(array, desc);
	uint64_t size = hcs_array_bytes(desc->Width, desc->Height, 0,
					hcs_array_element(desc->Format, desc->NumChannels), 0, 1);
	HCS_ALLOC_ON(cuda, cuArrayCreate_v2, (array, desc), HCS_KIND_ARRAY, (uintptr_t)*array,
		     size, cuda_ordinal());
}

CUresult hcs_cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	cuda_ready();
	if (!real_cuArray3DCreate_v2)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing() || !desc)
		return real_cuArray3DCreate_v2(array, desc);
	uint64_t size = hcs_array_bytes(desc->Width, desc->Height, desc->Depth,
					hcs_array_element(desc->Format, desc->NumChannels),
					desc->Flags, 1);
	HCS_ALLOC_ON(cuda, cuArray3DCreate_v2, (array, desc), HCS_KIND_ARRAY, (uintptr_t)*array,
		     size, cuda_ordinal());
}

CUresult hcs_cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
				    unsigned int levels)
{
	cuda_ready();
	if (!real_cuMipmappedArrayCreate)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing() || !desc)
		return real_cuMipmappedArrayCreate(array, desc, levels);
	uint64_t size = hcs_array_bytes(desc->Width, desc->Height, desc->Depth,
					hcs_array_element(desc->Format, desc->NumChannels),
					desc->Flags, levels);
	HCS_ALLOC_ON(cuda, cuMipmappedArrayCreate, (array, desc, levels), HCS_KIND_MIPMAP,
		     (uintptr_t)*array, size, cuda_ordinal());
}

/* What a limit reserves on `device`: the heap and the printf FIFO their size; the stack its
 * size for every thread the device can hold (multiprocessors x resident threads each). */
static uint64_t limit_bytes(CUlimit limit, size_t value, int device)
{
	if (limit != CU_LIMIT_STACK_SIZE)
		return value;
	int processors = 0, threads = 0;
	if (!real_cuDeviceGetAttribute ||
	    real_cuDeviceGetAttribute(&processors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
				      device) != CUDA_SUCCESS ||
	    real_cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
				      device) != CUDA_SUCCESS ||
	    processors <= 0 || threads <= 0) {
		processors = 256; /* unknown: more than any device has, never less */
		threads = 2048;
	}
	unsigned __int128 bytes = (unsigned __int128)value * (unsigned)processors * (unsigned)threads;
	return bytes > UINT64_MAX ? UINT64_MAX : (uint64_t)bytes;
}

/* Setting a limit again replaces its reservation: charged the difference when it grows,
 * credited when it shrinks. Limits that reserve no memory pass straight through. */
CUresult hcs_cuCtxSetLimit(CUlimit limit, size_t value)
{
	cuda_ready();
	if (!real_cuCtxSetLimit)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing() || (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_PRINTF_FIFO_SIZE &&
				 limit != CU_LIMIT_MALLOC_HEAP_SIZE))
		return real_cuCtxSetLimit(limit, value);
	int device = cuda_ordinal(), unused;
	uint64_t key = ((uint64_t)(unsigned)device << 8) | (unsigned)limit, before = 0;
	uint64_t after = limit_bytes(limit, value, device);
	hcs_lookup(key, HCS_KIND_LIMIT, &unused, &before);
	uint64_t more = after > before ? after - before : 0;
	if (hcs_alloc_begin(device, more) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = real_cuCtxSetLimit(limit, value);
	if (rc == CUDA_SUCCESS) {
		if (after < before)
			hcs_unreserve(device, before - after);
		hcs_track(key, HCS_KIND_LIMIT, device, after);
	} else {
		hcs_unreserve(device, more);
	}
	hcs_in_hook--;
	return rc;
}
