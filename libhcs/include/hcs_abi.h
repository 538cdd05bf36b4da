/* The few vendor ABI types and codes libhcs needs, declared here so that no vendor SDK is
 * needed to build. Each matches the vendor's public header (CUDA 12/13 cuda.h, NVML nvml.h,
 * HIP hip_runtime_api.h, CANN acl/acl_rt.h and runtime/rt.h, Cambricon cnrt.h and cn_api.h).
 * At the end: the usage region libhcs shares with hcsd (HCS's own format). */
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

/* ------------------------------------------------------------------------------------------
 * The container's usage region: HCS's own contract between hcsd (which creates it, and whose
 * watchdog reads the totals) and libhcs (which every process of the container maps MAP_SHARED
 * to share the quota).
 *
 * Where: beside quota.conf, `usage.shm` (in a container /run/hcs/usage.shm, a file hcsd
 * creates before the container starts, owned by the container's uid and gid, mode 0644 (0666 when the uid is unknown), as
 * its own bind mount or in a directory the container cannot write). libhcs opens it O_RDWR
 * without following symbolic links; it creates one itself only where none exists and it may
 * (a bare process with HCS_CONFIG, or an older hcsd), by writing it whole under a temporary
 * name and linking it into place, so no process ever sees half a region.
 *
 * Layout: little-endian, 35,328 bytes, fixed offsets (struct hcs_region below):
 *   0  header (32 bytes, written once by its creator, never changed)
 *        0  magic 0x4843535245474e31 (u64; the bytes "1NGERSCH")   8  version 3
 *       12  max devices 16          16  max processes 256          20  process slot size 136
 *       24  region size 35328       28  CRC-32 of bytes 0..27 (IEEE 802.3, as zlib.crc32)
 *  32  used bytes per device ordinal, the container's total (16 x u64; the ordinal is the
 *      device's position in quota.conf). Magic, version, device count and this array keep the
 *      offsets of version 1, which hcsd's watchdog reads.
 * 160  lock state (i32): 0 = the mutex is not set up yet, a pid = that process is setting it
 *      up, -1 = ready. The first process to use the region sets up the mutex (robust,
 *      process-shared) and stores -1.
 * 168  processes reclaimed (u64)  176  allocations refused for want of a slot (u64)
 * 192  the mutex (64 bytes; libhcs's pthread_mutex_t, opaque to anyone else)
 * 256  compute budget per device: {i64 window start (CLOCK_MONOTONIC ns), u64 busy ns}
 * 512  process slots, 256 x {i32 pid, u32 reserved, 16 x u64 used}
 *
 * An initialised empty region is exactly these 32 header bytes followed by 35,296 zero bytes:
 *   31 4e 47 45 52 53 43 48 03 00 00 00 10 00 00 00
 *   00 01 00 00 88 00 00 00 00 8a 00 00 be 0c d7 bd
 * In Python:
 *   header = struct.pack("<QIIIII", 0x4843535245474E31, 3, 16, 256, 136, 35328)
 *   region = header + struct.pack("<I", zlib.crc32(header)) + bytes(35328 - 32)
 * `hcs-region check FILE` (libhcs/build/hcs-region) says whether libhcs accepts a file;
 * `hcs-region init FILE` writes the bytes above.
 *
 * libhcs refuses (every allocation, with one line on stderr) a region it cannot open or map,
 * of the wrong size or type, or whose header does not match this one byte for byte (magic,
 * version, sizes, CRC): it never re-initialises an existing region, since the processes using
 * it may be alive. hcsd may read used[] and the slots for metrics; only libhcs writes them.
 * ------------------------------------------------------------------------------------------ */
#define HCS_REGION_MAGIC 0x4843535245474e31ULL
#define HCS_REGION_VERSION 3
#define HCS_REGION_MAX_DEVICES 16
#define HCS_REGION_MAX_PROCS 256
#define HCS_REGION_LOCK_READY (-1)

struct hcs_region_header {
	uint64_t magic;
	uint32_t version;
	uint32_t max_devices;
	uint32_t max_procs;
	uint32_t slot_size;
	uint32_t region_size;
	uint32_t crc32;
};

struct hcs_region_budget {
	int64_t window_start;
	uint64_t busy_ns;
};

struct hcs_region_proc {
	int32_t pid;
	uint32_t reserved;
	uint64_t used[HCS_REGION_MAX_DEVICES];
};

struct hcs_region {
	struct hcs_region_header header;
	uint64_t used[HCS_REGION_MAX_DEVICES];
	int32_t lock_state;
	uint32_t reserved0;
	uint64_t reclaimed_processes;
	uint64_t refused_without_slot;
	uint8_t reserved1[8];
	uint8_t lock[64] __attribute__((aligned(64)));
	struct hcs_region_budget compute[HCS_REGION_MAX_DEVICES];
	struct hcs_region_proc procs[HCS_REGION_MAX_PROCS];
};

_Static_assert(sizeof(struct hcs_region_header) == 32, "region header: 32 bytes");
_Static_assert(offsetof(struct hcs_region, used) == 32, "region layout (version 1's too)");
_Static_assert(offsetof(struct hcs_region, lock_state) == 160, "region layout");
_Static_assert(offsetof(struct hcs_region, lock) == 192, "region layout");
_Static_assert(offsetof(struct hcs_region, compute) == 256, "region layout");
_Static_assert(offsetof(struct hcs_region, procs) == 512, "region layout");
_Static_assert(sizeof(struct hcs_region_proc) == 136, "region layout");
_Static_assert(sizeof(struct hcs_region) == 35328, "region layout");

#endif
