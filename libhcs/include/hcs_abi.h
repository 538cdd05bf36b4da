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
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp as in cuda.h");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "location as in cuda.h");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps as in cuda.h");

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

/* HIP */
typedef int hipError_t;
typedef void *hipStream_t;
#define hipSuccess 0
#define hipErrorOutOfMemory 2

/* Ascend ACL and runtime */
typedef int aclError;
typedef int aclrtMemMallocPolicy;
typedef int aclrtMemAttr;
typedef int rtError_t;
typedef int rtMemInfoType_t;
typedef void *rtDrvMemHandle_t;
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

#endif
