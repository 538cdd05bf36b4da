/* The exported hook symbols (defined in hooks.c), for code that must hand out their addresses
 * (dlsym, cuGetProcAddress). */
#ifndef HCS_HOOKS_H
#define HCS_HOOKS_H

#include "hcs_abi.h"

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
			    unsigned int element_size);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
				 CUstream stream);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
		     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			CUstream stream, void **params, void **extra);
CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra);
CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags);
hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream);
hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags);
hipError_t hipFree(void *ptr);
hipError_t hipFreeAsync(void *ptr, hipStream_t stream);
hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes);
aclError aclrtMalloc(void **ptr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *ptr);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_bytes, size_t *total_bytes);
rtError_t rtMalloc(void **ptr, uint64_t size, int type, uint16_t module_id);
rtError_t rtFree(void *ptr);
rtError_t rtMallocPhysical(rtDrvMemHandle_t *handle, size_t size, void *prop, uint64_t flags);
rtError_t rtFreePhysical(rtDrvMemHandle_t handle);
rtError_t rtMemGetInfoEx(rtMemInfoType_t type, size_t *free_bytes, size_t *total_bytes);
cnrtRet_t cnrtMalloc(void **ptr, size_t size);
cnrtRet_t cnrtFree(void *ptr);
cnrtRet_t cnrtMemGetInfo(size_t *free_bytes, size_t *total_bytes);
CNresult cnMalloc(CNaddr *ptr, uint64_t size);
CNresult cnFree(CNaddr ptr);

#endif
