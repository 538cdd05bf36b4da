/* Every symbol libhcs hooks, written once. From these rows come the exported wrappers
 * (exports.c), the version script (libhcs.map.in), the dlsym table (exports.c), the
 * cuGetProcAddress swap table (cuda.c), each backend's real-function pointers and their
 * resolution, and the bodies of the hooks whose shape is common (backend.h).
 *
 * A row: X(vendor, ret, name, params, args, role, a, b, c)
 *   vendor   the backend (cuda, nvml, hip, acl, rt, cnrt, cn): its library, device query and
 *            return codes (HCS_OK_<vendor>, HCS_OOM_<vendor>, HCS_MISSING_<vendor>)
 *   role     ALLOC  a = tracking kind, b = key (read after the call), c = size
 *            FREE   a = tracking kind, b = key
 *            INFO   b = free-bytes pointer, c = total-bytes pointer (clamped to the quota)
 *            LAUNCH b = stream (paced by the compute share)
 *            CUSTOM the backend writes hcs_<name> itself
 * Only macros here (no types), so the version script can be generated with cpp alone. */
#ifndef HCS_SYMBOLS_H
#define HCS_SYMBOLS_H

#define HCS_LAUNCH_PARAMS                                                                    \
	(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,   \
	 unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params, \
	 void **extra)
#define HCS_LAUNCH_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define HCS_COOPERATIVE_PARAMS                                                               \
	(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,   \
	 unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params)
#define HCS_COOPERATIVE_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

/* CUDA, by concern (one source file each). The _ptsz names are the per-thread-default-stream
 * entry points: exported by libcuda and returned by cuGetProcAddress with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
#define HCS_SYMBOLS_cuda_memory(X)                                                           \
	X(cuda, CUresult, cuMemAlloc_v2, (CUdeviceptr *p, size_t s), (p, s),                 \
	  ALLOC, HCS_KIND_PTR, *p, s)                                                        \
	X(cuda, CUresult, cuMemAllocPitch_v2,                                                \
	  (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e),               \
	  (p, pitch, w, h, e), CUSTOM, 0, 0, 0)                                              \
	X(cuda, CUresult, cuMemAllocManaged, (CUdeviceptr *p, size_t s, unsigned int fl),    \
	  (p, s, fl), ALLOC, HCS_KIND_PTR, *p, s)                                            \
	X(cuda, CUresult, cuMemAllocAsync, (CUdeviceptr *p, size_t s, CUstream st),          \
	  (p, s, st), ALLOC, HCS_KIND_PTR, *p, s)                                            \
	X(cuda, CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t s, CUstream st),     \
	  (p, s, st), ALLOC, HCS_KIND_PTR, *p, s)                                            \
	X(cuda, CUresult, cuMemAllocFromPoolAsync,                                           \
	  (CUdeviceptr *p, size_t s, CUmemoryPool pool, CUstream st), (p, s, pool, st),      \
	  CUSTOM, 0, 0, 0)                                                                   \
	X(cuda, CUresult, cuMemAllocFromPoolAsync_ptsz,                                      \
	  (CUdeviceptr *p, size_t s, CUmemoryPool pool, CUstream st), (p, s, pool, st),      \
	  CUSTOM, 0, 0, 0)                                                                   \
	X(cuda, CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *props), \
	  (pool, props), CUSTOM, 0, 0, 0)                                                    \
	X(cuda, CUresult, cuMemPoolDestroy, (CUmemoryPool pool), (pool), CUSTOM, 0, 0, 0)    \
	X(cuda, CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool, CUdevice dev),     \
	  (pool, dev), CUSTOM, 0, 0, 0)                                                      \
	X(cuda, CUresult, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev), (pool, dev), \
	  CUSTOM, 0, 0, 0)                                                                   \
	X(cuda, CUresult, cuMemFree_v2, (CUdeviceptr p), (p), FREE, HCS_KIND_PTR, p, 0)      \
	X(cuda, CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream st), (p, st),             \
	  FREE, HCS_KIND_PTR, p, 0)                                                          \
	X(cuda, CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream st), (p, st),        \
	  FREE, HCS_KIND_PTR, p, 0)                                                          \
	X(cuda, CUresult, cuMemCreate,                                                       \
	  (CUmemGenericAllocationHandle *h, size_t s, const CUmemAllocationProp *prop,       \
	   unsigned long long fl),                                                           \
	  (h, s, prop, fl), CUSTOM, 0, 0, 0)                                                 \
	X(cuda, CUresult, cuMemRelease, (CUmemGenericAllocationHandle h), (h),               \
	  CUSTOM, 0, 0, 0)                                                                   \
	X(cuda, CUresult, cuMemImportFromShareableHandle,                                    \
	  (CUmemGenericAllocationHandle *h, void *os_handle, CUmemAllocationHandleType type), \
	  (h, os_handle, type), CUSTOM, 0, 0, 0)                                             \
	X(cuda, CUresult, cuMemMap,                                                          \
	  (CUdeviceptr ptr, size_t s, size_t offset, CUmemGenericAllocationHandle h,         \
	   unsigned long long fl),                                                           \
	  (ptr, s, offset, h, fl), CUSTOM, 0, 0, 0)                                          \
	X(cuda, CUresult, cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t), INFO, 0, f, t)    \
	X(cuda, CUresult, cuGetProcAddress, (const char *sym, void **pfn, int v, cuuint64_t fl), \
	  (sym, pfn, v, fl), CUSTOM, 0, 0, 0)                                                \
	X(cuda, CUresult, cuGetProcAddress_v2,                                               \
	  (const char *sym, void **pfn, int v, cuuint64_t fl, CUdriverProcAddressQueryResult *st), \
	  (sym, pfn, v, fl, st), CUSTOM, 0, 0, 0)

#define HCS_SYMBOLS_cuda_array(X)                                                            \
	X(cuda, CUresult, cuArrayCreate_v2, (CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d),    \
	  (a, d), CUSTOM, 0, 0, 0)                                                           \
	X(cuda, CUresult, cuArray3DCreate_v2, (CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d), \
	  (a, d), CUSTOM, 0, 0, 0)                                                           \
	X(cuda, CUresult, cuMipmappedArrayCreate,                                            \
	  (CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels),      \
	  (a, d, levels), CUSTOM, 0, 0, 0)                                                   \
	X(cuda, CUresult, cuArrayDestroy, (CUarray a), (a),                                  \
	  FREE, HCS_KIND_ARRAY, (uintptr_t)a, 0)                                             \
	X(cuda, CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray a), (a),                \
	  FREE, HCS_KIND_MIPMAP, (uintptr_t)a, 0)                                            \
	X(cuda, CUresult, cuCtxSetLimit, (CUlimit limit, size_t value), (limit, value),      \
	  CUSTOM, 0, 0, 0)

#define HCS_SYMBOLS_cuda_graph(X)                                                            \
	X(cuda, CUresult, cuGraphAddMemAllocNode,                                            \
	  (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,                  \
	   CUDA_MEM_ALLOC_NODE_PARAMS *params),                                              \
	  (node, g, deps, n, params), CUSTOM, 0, 0, 0)                                       \
	X(cuda, CUresult, cuGraphAddMemFreeNode,                                             \
	  (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr dptr), \
	  (node, g, deps, n, dptr), CUSTOM, 0, 0, 0)                                         \
	X(cuda, CUresult, cuGraphAddNode,                                                    \
	  (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,                  \
	   CUgraphNodeParams *params),                                                       \
	  (node, g, deps, n, params), CUSTOM, 0, 0, 0)                                       \
	X(cuda, CUresult, cuGraphAddNode_v2,                                                 \
	  (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, \
	   size_t n, CUgraphNodeParams *params),                                             \
	  (node, g, deps, edges, n, params), CUSTOM, 0, 0, 0)                                \
	X(cuda, CUresult, cuGraphDestroy, (CUgraph g), (g), CUSTOM, 0, 0, 0)

#define HCS_SYMBOLS_cuda_launch(X)                                                           \
	X(cuda, CUresult, cuLaunchKernel, HCS_LAUNCH_PARAMS, HCS_LAUNCH_ARGS,                 \
	  LAUNCH, 0, stream, 0)                                                              \
	X(cuda, CUresult, cuLaunchKernel_ptsz, HCS_LAUNCH_PARAMS, HCS_LAUNCH_ARGS,            \
	  LAUNCH, 0, stream, 0)                                                              \
	X(cuda, CUresult, cuLaunchKernelEx,                                                  \
	  (const void *config, CUfunction f, void **params, void **extra),                   \
	  (config, f, params, extra), CUSTOM, 0, 0, 0)                                       \
	X(cuda, CUresult, cuLaunchKernelEx_ptsz,                                             \
	  (const void *config, CUfunction f, void **params, void **extra),                   \
	  (config, f, params, extra), CUSTOM, 0, 0, 0)                                       \
	X(cuda, CUresult, cuLaunchCooperativeKernel, HCS_COOPERATIVE_PARAMS,                 \
	  HCS_COOPERATIVE_ARGS, LAUNCH, 0, stream, 0)                                        \
	X(cuda, CUresult, cuLaunchCooperativeKernel_ptsz, HCS_COOPERATIVE_PARAMS,            \
	  HCS_COOPERATIVE_ARGS, LAUNCH, 0, stream, 0)                                        \
	X(cuda, CUresult, cuGraphLaunch, (CUgraphExec g, CUstream stream), (g, stream),      \
	  LAUNCH, 0, stream, 0)                                                              \
	X(cuda, CUresult, cuGraphLaunch_ptsz, (CUgraphExec g, CUstream stream), (g, stream), \
	  LAUNCH, 0, stream, 0)

#define HCS_SYMBOLS_cuda(X)                                                                  \
	HCS_SYMBOLS_cuda_memory(X) HCS_SYMBOLS_cuda_array(X) HCS_SYMBOLS_cuda_graph(X)       \
	HCS_SYMBOLS_cuda_launch(X)

#define HCS_SYMBOLS_nvml(X)                                                                  \
	X(nvml, nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t d, nvmlMemory_t *m),    \
	  (d, m), CUSTOM, 0, 0, 0)                                                           \
	X(nvml, nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t d, nvmlMemory_v2_t *m), \
	  (d, m), CUSTOM, 0, 0, 0)

#define HCS_SYMBOLS_hip(X)                                                                   \
	X(hip, hipError_t, hipMalloc, (void **p, size_t s), (p, s),                          \
	  ALLOC, HCS_KIND_HIP, (uintptr_t)*p, s)                                             \
	X(hip, hipError_t, hipMallocManaged, (void **p, size_t s, unsigned int fl), (p, s, fl), \
	  ALLOC, HCS_KIND_HIP, (uintptr_t)*p, s)                                             \
	X(hip, hipError_t, hipMallocAsync, (void **p, size_t s, hipStream_t st), (p, s, st), \
	  ALLOC, HCS_KIND_HIP, (uintptr_t)*p, s)                                             \
	X(hip, hipError_t, hipExtMallocWithFlags, (void **p, size_t s, unsigned int fl),     \
	  (p, s, fl), ALLOC, HCS_KIND_HIP, (uintptr_t)*p, s)                                 \
	X(hip, hipError_t, hipMallocFromPoolAsync,                                           \
	  (void **p, size_t s, hipMemPool_t pool, hipStream_t st), (p, s, pool, st),         \
	  ALLOC, HCS_KIND_HIP, (uintptr_t)*p, s)                                             \
	X(hip, hipError_t, hipMallocPitch, (void **p, size_t *pitch, size_t w, size_t h),    \
	  (p, pitch, w, h), CUSTOM, 0, 0, 0)                                                 \
	X(hip, hipError_t, hipMemAllocPitch,                                                 \
	  (hipDeviceptr_t *p, size_t *pitch, size_t w, size_t h, unsigned int e),            \
	  (p, pitch, w, h, e), CUSTOM, 0, 0, 0)                                              \
	X(hip, hipError_t, hipMalloc3D, (hipPitchedPtr *pp, hipExtent e), (pp, e),           \
	  CUSTOM, 0, 0, 0)                                                                   \
	X(hip, hipError_t, hipMallocArray,                                                   \
	  (hipArray_t *a, const hipChannelFormatDesc *d, size_t w, size_t h, unsigned int fl), \
	  (a, d, w, h, fl), CUSTOM, 0, 0, 0)                                                 \
	X(hip, hipError_t, hipMalloc3DArray,                                                 \
	  (hipArray_t *a, const hipChannelFormatDesc *d, hipExtent e, unsigned int fl),      \
	  (a, d, e, fl), CUSTOM, 0, 0, 0)                                                    \
	X(hip, hipError_t, hipArrayCreate, (hipArray_t *a, const HIP_ARRAY_DESCRIPTOR *d),   \
	  (a, d), CUSTOM, 0, 0, 0)                                                           \
	X(hip, hipError_t, hipArray3DCreate, (hipArray_t *a, const HIP_ARRAY3D_DESCRIPTOR *d), \
	  (a, d), CUSTOM, 0, 0, 0)                                                           \
	X(hip, hipError_t, hipFreeArray, (hipArray_t a), (a),                                \
	  FREE, HCS_KIND_HIP_ARRAY, (uintptr_t)a, 0)                                         \
	X(hip, hipError_t, hipArrayDestroy, (hipArray_t a), (a),                             \
	  FREE, HCS_KIND_HIP_ARRAY, (uintptr_t)a, 0)                                         \
	X(hip, hipError_t, hipMemCreate,                                                     \
	  (hipMemGenericAllocationHandle_t *h, size_t s, const hipMemAllocationProp *prop,   \
	   unsigned long long fl),                                                           \
	  (h, s, prop, fl), CUSTOM, 0, 0, 0)                                                 \
	X(hip, hipError_t, hipMemRelease, (hipMemGenericAllocationHandle_t h), (h),          \
	  FREE, HCS_KIND_HIP_VMM, (uintptr_t)h, 0)                                           \
	X(hip, hipError_t, hipFree, (void *p), (p), FREE, HCS_KIND_HIP, (uintptr_t)p, 0)     \
	X(hip, hipError_t, hipFreeAsync, (void *p, hipStream_t st), (p, st),                 \
	  FREE, HCS_KIND_HIP, (uintptr_t)p, 0)                                               \
	X(hip, hipError_t, hipMemGetInfo, (size_t *f, size_t *t), (f, t), INFO, 0, f, t)

#define HCS_SYMBOLS_acl(X)                                                                   \
	X(acl, aclError, aclrtMalloc, (void **p, size_t s, aclrtMemMallocPolicy pol),        \
	  (p, s, pol), ALLOC, HCS_KIND_ACL, (uintptr_t)*p, s)                                \
	X(acl, aclError, aclrtMallocAlign32, (void **p, size_t s, aclrtMemMallocPolicy pol), \
	  (p, s, pol), ALLOC, HCS_KIND_ACL, (uintptr_t)*p, s)                                \
	X(acl, aclError, aclrtMallocCached, (void **p, size_t s, aclrtMemMallocPolicy pol),  \
	  (p, s, pol), ALLOC, HCS_KIND_ACL, (uintptr_t)*p, s)                                \
	X(acl, aclError, aclrtMallocWithCfg,                                                 \
	  (void **p, size_t s, aclrtMemMallocPolicy pol, aclrtMallocConfig *cfg),            \
	  (p, s, pol, cfg), ALLOC, HCS_KIND_ACL, (uintptr_t)*p, s)                           \
	X(acl, aclError, aclrtMallocPhysical,                                                \
	  (aclrtDrvMemHandle *h, size_t s, const aclrtPhysicalMemProp *prop, uint64_t fl),   \
	  (h, s, prop, fl), CUSTOM, 0, 0, 0)                                                 \
	X(acl, aclError, aclrtFree, (void *p), (p), FREE, HCS_KIND_ACL, (uintptr_t)p, 0)     \
	X(acl, aclError, aclrtFreeWithDevSync, (void *p), (p),                               \
	  FREE, HCS_KIND_ACL, (uintptr_t)p, 0)                                               \
	X(acl, aclError, aclrtFreePhysical, (aclrtDrvMemHandle h), (h),                      \
	  FREE, HCS_KIND_ACL_PHYS, (uintptr_t)h, 0)                                          \
	X(acl, aclError, aclrtGetMemInfo, (aclrtMemAttr a, size_t *f, size_t *t), (a, f, t), \
	  INFO, 0, f, t)

#define HCS_SYMBOLS_rt(X)                                                                    \
	X(rt, rtError_t, rtMalloc, (void **p, uint64_t s, int type, uint16_t module),        \
	  (p, s, type, module), ALLOC, HCS_KIND_RT, (uintptr_t)*p, s)                        \
	X(rt, rtError_t, rtFree, (void *p), (p), FREE, HCS_KIND_RT, (uintptr_t)p, 0)         \
	X(rt, rtError_t, rtMallocPhysical,                                                   \
	  (rtDrvMemHandle_t *h, size_t s, void *prop, uint64_t fl), (h, s, prop, fl),        \
	  ALLOC, HCS_KIND_RT_PHYS, (uintptr_t)*h, s)                                         \
	X(rt, rtError_t, rtFreePhysical, (rtDrvMemHandle_t h), (h),                          \
	  FREE, HCS_KIND_RT_PHYS, (uintptr_t)h, 0)                                           \
	X(rt, rtError_t, rtMemGetInfoEx, (rtMemInfoType_t type, size_t *f, size_t *t),       \
	  (type, f, t), INFO, 0, f, t)

#define HCS_SYMBOLS_cnrt(X)                                                                  \
	X(cnrt, cnrtRet_t, cnrtMalloc, (void **p, size_t s), (p, s),                         \
	  ALLOC, HCS_KIND_CNRT, (uintptr_t)*p, s)                                            \
	X(cnrt, cnrtRet_t, cnrtMallocPeerAble, (void **p, size_t s), (p, s),                 \
	  ALLOC, HCS_KIND_CNRT, (uintptr_t)*p, s)                                            \
	X(cnrt, cnrtRet_t, cnrtMallocFrameBuffer, (void **p, size_t s), (p, s),              \
	  ALLOC, HCS_KIND_CNRT, (uintptr_t)*p, s)                                            \
	X(cnrt, cnrtRet_t, cnrtFree, (void *p), (p), FREE, HCS_KIND_CNRT, (uintptr_t)p, 0)   \
	X(cnrt, cnrtRet_t, cnrtFreeArray, (void **p, int n), (p, n), CUSTOM, 0, 0, 0)        \
	X(cnrt, cnrtRet_t, cnrtMemGetInfo, (size_t *f, size_t *t), (f, t), INFO, 0, f, t)

#define HCS_SYMBOLS_cn(X)                                                                    \
	X(cn, CNresult, cnMalloc, (CNaddr *p, uint64_t s), (p, s), ALLOC, HCS_KIND_CN, *p, s) \
	X(cn, CNresult, cnZmalloc, (CNaddr *p, uint64_t s), (p, s), ALLOC, HCS_KIND_CN, *p, s) \
	X(cn, CNresult, cnMallocConstant, (CNaddr *p, uint64_t s), (p, s),                   \
	  ALLOC, HCS_KIND_CN, *p, s)                                                         \
	X(cn, CNresult, cnMallocSecurity, (CNaddr *p, uint64_t s), (p, s),                   \
	  ALLOC, HCS_KIND_CN, *p, s)                                                         \
	X(cn, CNresult, cnMallocPeerAble, (CNaddr *p, uint64_t s), (p, s),                   \
	  ALLOC, HCS_KIND_CN, *p, s)                                                         \
	X(cn, CNresult, cnFree, (CNaddr p), (p), FREE, HCS_KIND_CN, p, 0)

#define HCS_SYMBOLS(X)                                                                       \
	HCS_SYMBOLS_cuda(X) HCS_SYMBOLS_nvml(X) HCS_SYMBOLS_hip(X) HCS_SYMBOLS_acl(X)        \
	HCS_SYMBOLS_rt(X) HCS_SYMBOLS_cnrt(X) HCS_SYMBOLS_cn(X)

#endif
