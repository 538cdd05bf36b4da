/* Cambricon: CNRT (`cnrtMalloc`, …) and the CNDrv driver API (`cnMalloc`, `cnFree`). Rows in
 * symbols.h. */
#include "backend.h"

static const char *const cnrt_libraries[] = {"libcnrt.so", NULL};
static const char *const cn_libraries[] = {"libcndrv.so", NULL};
#define HCS_OK_cnrt CNRT_RET_SUCCESS
#define HCS_OOM_cnrt CNRT_RET_ERR_NOMEM
#define HCS_MISSING_cnrt 632017 /* CNRT_RET_ERR_NOSYS */
#define HCS_OK_cn CN_SUCCESS
#define HCS_OOM_cn CN_MEMORY_ERROR_OUT_OF_MEMORY
#define HCS_MISSING_cn 1 /* CN_ERROR_INVALID_VALUE */
#define CNRT_HELPERS(Y) Y(cnrt, cnrtRet_t, cnrtGetDevice, (int *device))
#define CN_HELPERS(Y) Y(cn, CNresult, cnCtxGetDevice, (int *device))

HCS_BACKEND(cnrt, HCS_SYMBOLS_cnrt, CNRT_HELPERS)
HCS_BACKEND(cn, HCS_SYMBOLS_cn, CN_HELPERS)

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

HCS_SYMBOLS_cnrt(HCS_DEFINE_HOOK)
HCS_SYMBOLS_cn(HCS_DEFINE_HOOK)

/* Frees several cnrtMalloc'd pointers in one call: credited together when it succeeds. */
cnrtRet_t hcs_cnrtFreeArray(void **pointers, int count)
{
	cnrt_ready();
	if (!real_cnrtFreeArray)
		return HCS_MISSING_cnrt;
	if (!pointers || count <= 0)
		return real_cnrtFreeArray(pointers, count);
	enum { BATCH = 256 };
	int devices[BATCH];
	uint64_t sizes[BATCH];
	bool tracked[BATCH];
	int taken = count < BATCH ? count : BATCH; /* beyond that: passed through, uncredited */
	hcs_in_hook++;
	for (int i = 0; i < taken; i++)
		tracked[i] = hcs_untrack((uint64_t)(uintptr_t)pointers[i], HCS_KIND_CNRT, &devices[i],
					 &sizes[i]);
	cnrtRet_t rc = real_cnrtFreeArray(pointers, count);
	for (int i = 0; i < taken; i++) {
		if (!tracked[i])
			continue;
		if (rc == CNRT_RET_SUCCESS)
			hcs_unreserve(devices[i], sizes[i]);
		else
			hcs_track((uint64_t)(uintptr_t)pointers[i], HCS_KIND_CNRT, devices[i],
				  sizes[i]);
	}
	hcs_in_hook--;
	return rc;
}
