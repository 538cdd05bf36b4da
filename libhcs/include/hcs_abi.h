/* The few vendor ABI types and codes libhcs needs, declared here so that no vendor SDK is
 * needed to build. Each matches the vendor's public header (CUDA 12 cuda.h, NVML nvml.h,
 * HIP hip_runtime_api.h, CANN acl/acl_rt.h and runtime/rt.h, Cambricon cnrt.h and cn_api.h). */
#ifndef HCS_ABI_H
#define HCS_ABI_H

#include <stddef.h>
#include <stdint.h>

/* CUDA driver API */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUfunction;
typedef void *CUgraphExec;
typedef uint64_t cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500

/* Where VMM and pool memory lives (CUmemLocationType): only DEVICE is device memory. */
#define CU_MEM_LOCATION_TYPE_INVALID 0
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_LOCATION_TYPE_HOST 2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
typedef struct CUmemLocation_st {
	int type; /* CUmemLocationType */
	int id;   /* device ordinal for DEVICE, NUMA node for HOST_NUMA, ignored otherwise */
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
	int type;                 /* CUmemAllocationType */
	int requestedHandleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct CUmemPoolProps_st {
	int allocType;   /* CUmemAllocationType */
	int handleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CUmemPoolProps;
typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

/* Per-thread default stream entry points (cuGetProcAddress flags). */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* Arrays (CUDA_ARRAY_DESCRIPTOR_v2, CUDA_ARRAY3D_DESCRIPTOR_v2; Format is CUarray_format). */
typedef void *CUarray;
typedef void *CUmipmappedArray;
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
	size_t Width;
	size_t Height;
	int Format;
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
	size_t Width;
	size_t Height;
	size_t Depth;
	int Format;
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
#define CUDA_ARRAY3D_SPARSE 0x40
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80

/* Context limits that reserve device memory (CUlimit), and the device attributes the stack
 * reservation scales with (CUdevice_attribute). */
typedef int CUlimit;
#define CU_LIMIT_STACK_SIZE 0x00
#define CU_LIMIT_PRINTF_FIFO_SIZE 0x01
#define CU_LIMIT_MALLOC_HEAP_SIZE 0x02
#define CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH 0x03
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39

/* Graph memory nodes (CUDA_MEM_ALLOC_NODE_PARAMS_v1/_v2 share a layout; CUgraphNodeParams
 * for cuGraphAddNode). */
typedef void *CUgraph;
typedef void *CUgraphNode;
typedef void CUgraphEdgeData; /* only passed through */
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
	CUmemPoolProps poolProps;
	const CUmemAccessDesc *accessDescs;
	size_t accessDescCount;
	size_t bytesize;
	CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct CUDA_MEM_FREE_NODE_PARAMS_st {
	CUdeviceptr dptr;
} CUDA_MEM_FREE_NODE_PARAMS;
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define CU_GRAPH_NODE_TYPE_MEM_FREE 11
typedef struct CUgraphNodeParams_st {
	int type; /* CUgraphNodeType */
	int reserved0[3];
	union {
		long long reserved1[29];
		CUDA_MEM_ALLOC_NODE_PARAMS alloc;
		CUDA_MEM_FREE_NODE_PARAMS free;
	};
	long long reserved2;
} CUgraphNodeParams;

/* Shareable handles (CUmemAllocationHandleType). */
typedef int CUmemAllocationHandleType;
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp as in cuda.h");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "location as in cuda.h");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps as in cuda.h");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR as in cuda.h");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104, "as in cuda.h");
_Static_assert(offsetof(CUgraphNodeParams, alloc) == 16, "CUgraphNodeParams as in cuda.h");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams as in cuda.h");

/* NVML */
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;
typedef struct {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_SUCCESS 0
#define NVML_DEVICE_UUID_BUFFER_SIZE 80

/* HIP (hip_runtime_api.h; arrays and VMM mirror CUDA's layouts and values) */
typedef int hipError_t;
typedef void *hipStream_t;
typedef void *hipMemPool_t;
typedef void *hipArray_t;
typedef void *hipDeviceptr_t;
typedef struct ihipMemGenericAllocationHandle *hipMemGenericAllocationHandle_t;
typedef struct hipChannelFormatDesc {
	int x, y, z, w; /* bits per channel */
	int f;          /* hipChannelFormatKind */
} hipChannelFormatDesc;
typedef struct hipExtent {
	size_t width, height, depth;
} hipExtent;
typedef struct hipPitchedPtr {
	void *ptr;
	size_t pitch;
	size_t xsize;
	size_t ysize;
} hipPitchedPtr;
typedef CUDA_ARRAY_DESCRIPTOR HIP_ARRAY_DESCRIPTOR;
typedef CUDA_ARRAY3D_DESCRIPTOR HIP_ARRAY3D_DESCRIPTOR;
typedef CUmemLocation hipMemLocation; /* hipMemLocationType: CU_MEM_LOCATION_TYPE_* values */
typedef struct hipMemAllocationProp {
	int type;                /* hipMemAllocationType */
	int requestedHandleType; /* hipMemAllocationHandleType */
	hipMemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
	} allocFlags;
} hipMemAllocationProp;
#define hipSuccess 0
#define hipErrorOutOfMemory 2

/* Ascend ACL and runtime */
typedef int aclError;
typedef int aclrtMemMallocPolicy;
typedef int aclrtMemAttr;
typedef int rtError_t;
typedef int rtMemInfoType_t;
typedef void *rtDrvMemHandle_t;
typedef void *aclrtDrvMemHandle;
typedef void aclrtMallocConfig; /* only passed through */
#define ACL_MEM_LOCATION_TYPE_HOST 0
#define ACL_MEM_LOCATION_TYPE_DEVICE 1
typedef struct aclrtMemLocation {
	uint32_t id;
	int type; /* aclrtMemLocationType */
} aclrtMemLocation;
typedef struct aclrtPhysicalMemProp {
	int handleType;     /* aclrtMemHandleType */
	int allocationType; /* aclrtMemAllocationType */
	int memAttr;        /* aclrtMemAttr */
	aclrtMemLocation location;
	uint64_t reserve;
} aclrtPhysicalMemProp;
#define ACL_SUCCESS 0
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define RT_ERROR_NONE 0

/* Cambricon CNRT and CNDrv */
typedef int cnrtRet_t;
typedef int CNresult;
typedef uint64_t CNaddr;
#define CNRT_RET_SUCCESS 0
#define CNRT_RET_ERR_NOMEM 632008
#define CN_SUCCESS 0
#define CN_MEMORY_ERROR_OUT_OF_MEMORY 100100

_Static_assert(offsetof(hipMemAllocationProp, location) == 8, "as in hip_runtime_api.h");
_Static_assert(sizeof(hipPitchedPtr) == 32 && sizeof(hipExtent) == 24, "as in HIP");
_Static_assert(offsetof(aclrtPhysicalMemProp, location) == 12 &&
		       sizeof(aclrtPhysicalMemProp) == 32, "as in acl_rt.h");

#endif
