/* Cambricon: CNRT (`cnrtMalloc`, …) and the CNDrv driver API (`cnMalloc`, `cnFree`). */
#include <pthread.h>

#include "common.h"

static const char *const cnrt_libraries[] = {"libcnrt.so", NULL};
static const char *const cndrv_libraries[] = {"libcndrv.so", NULL};
static cnrtRet_t (*real_cnrtMalloc)(void **, size_t);
static cnrtRet_t (*real_cnrtFree)(void *);
static cnrtRet_t (*real_cnrtMemGetInfo)(size_t *, size_t *);
static cnrtRet_t (*real_cnrtGetDevice)(int *);
static CNresult (*real_cnMalloc)(CNaddr *, uint64_t);
static CNresult (*real_cnFree)(CNaddr);
static CNresult (*real_cnCtxGetDevice)(int *);
static pthread_once_t cnrt_once = PTHREAD_ONCE_INIT, cndrv_once = PTHREAD_ONCE_INIT;

static void resolve_cnrt(void)
{
	HCS_RESOLVE(cnrt_libraries, cnrtMalloc);
	HCS_RESOLVE(cnrt_libraries, cnrtFree);
	HCS_RESOLVE(cnrt_libraries, cnrtMemGetInfo);
	HCS_RESOLVE(cnrt_libraries, cnrtGetDevice);
}

static void resolve_cndrv(void)
{
	HCS_RESOLVE(cndrv_libraries, cnMalloc);
	HCS_RESOLVE(cndrv_libraries, cnFree);
	HCS_RESOLVE(cndrv_libraries, cnCtxGetDevice);
}

static int cnrt_ordinal(void)
{
	int device = 0;
	if (real_cnrtGetDevice && real_cnrtGetDevice(&device) == CNRT_RET_SUCCESS)
		return device;
	return 0;
}

static int cn_ordinal(void)
{
	int device = 0;
	if (real_cnCtxGetDevice && real_cnCtxGetDevice(&device) == CN_SUCCESS)
		return device;
	return 0;
}

#define CNRT_NOT_FOUND 632017 /* CNRT_RET_ERR_NOSYS */
#define CN_NOT_FOUND 1        /* CN_ERROR_INVALID_VALUE */

cnrtRet_t hcs_cnrtMalloc(void **ptr, size_t size)
{
	pthread_once(&cnrt_once, resolve_cnrt);
	if (!real_cnrtMalloc)
		return CNRT_NOT_FOUND;
	if (!hcs_enforcing())
		return real_cnrtMalloc(ptr, size);
	int device = cnrt_ordinal();
	if (hcs_alloc_begin(device, size) != 0)
		return CNRT_RET_ERR_NOMEM;
	cnrtRet_t rc = real_cnrtMalloc(ptr, size);
	hcs_alloc_end(rc == CNRT_RET_SUCCESS, rc == CNRT_RET_SUCCESS ? (uint64_t)(uintptr_t)*ptr : 0,
		      HCS_KIND_CNRT, device, size);
	return rc;
}

cnrtRet_t hcs_cnrtFree(void *ptr)
{
	pthread_once(&cnrt_once, resolve_cnrt);
	if (!real_cnrtFree)
		return CNRT_NOT_FOUND;
	int device;
	uint64_t size;
	bool tracked = hcs_free_begin((uint64_t)(uintptr_t)ptr, HCS_KIND_CNRT, &device, &size);
	cnrtRet_t rc = real_cnrtFree(ptr);
	hcs_free_end(tracked, rc == CNRT_RET_SUCCESS, (uint64_t)(uintptr_t)ptr, HCS_KIND_CNRT,
		     device, size);
	return rc;
}

cnrtRet_t hcs_cnrtMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	pthread_once(&cnrt_once, resolve_cnrt);
	if (!real_cnrtMemGetInfo)
		return CNRT_NOT_FOUND;
	cnrtRet_t rc = real_cnrtMemGetInfo(free_bytes, total_bytes);
	if (rc == CNRT_RET_SUCCESS && hcs_cfg.enforcing)
		hcs_clamp_info(cnrt_ordinal(), free_bytes, total_bytes);
	return rc;
}

CNresult hcs_cnMalloc(CNaddr *ptr, uint64_t size)
{
	pthread_once(&cndrv_once, resolve_cndrv);
	if (!real_cnMalloc)
		return CN_NOT_FOUND;
	if (!hcs_enforcing())
		return real_cnMalloc(ptr, size);
	int device = cn_ordinal();
	if (hcs_alloc_begin(device, size) != 0)
		return CN_MEMORY_ERROR_OUT_OF_MEMORY;
	CNresult rc = real_cnMalloc(ptr, size);
	hcs_alloc_end(rc == CN_SUCCESS, rc == CN_SUCCESS ? *ptr : 0, HCS_KIND_CN, device, size);
	return rc;
}

CNresult hcs_cnFree(CNaddr ptr)
{
	pthread_once(&cndrv_once, resolve_cndrv);
	if (!real_cnFree)
		return CN_NOT_FOUND;
	int device;
	uint64_t size;
	bool tracked = hcs_free_begin(ptr, HCS_KIND_CN, &device, &size);
	CNresult rc = real_cnFree(ptr);
	hcs_free_end(tracked, rc == CN_SUCCESS, ptr, HCS_KIND_CN, device, size);
	return rc;
}
