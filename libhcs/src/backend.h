/* What every vendor backend shares: the brackets around a real allocation and a real free,
 * memory info inside the quota, and the macros that turn the rows of symbols.h into a
 * backend's real-function pointers, their one-time resolution and the bodies of its hooks.
 *
 * A backend file defines, for its vendor v: `v_libraries` (NULL-terminated sonames),
 * HCS_OK_v, HCS_OOM_v, HCS_MISSING_v (its success, out-of-memory and "library lacks the
 * function" codes) and `static int v_ordinal(void)` (the current device), then writes
 *     HCS_BACKEND(v, HCS_SYMBOLS_v, helpers)   real pointers, v_resolve(), v_ready()
 *     HCS_SYMBOLS_v(HCS_DEFINE_HOOK)            hcs_<name> for every row not CUSTOM
 * and by hand the CUSTOM rows. `helpers` lists, as Y(v, ret, name, params), real functions
 * the backend calls without hooking them (the current-device query). */
#ifndef HCS_BACKEND_H
#define HCS_BACKEND_H

#include <pthread.h>

#include "hcs_abi.h"
#include "internal.h"
#include "symbols.h"

/* Before the real allocation: 0 to go ahead, -1 to refuse with the vendor's OOM code. */
static inline int hcs_alloc_begin(int ordinal, uint64_t size)
{
	hcs_in_hook++;
	if (hcs_reserve(ordinal, size) != 0) {
		hcs_in_hook--;
		return -1;
	}
	return 0;
}

/* After it: record what it cost, or give the reservation back if it failed. */
static inline void hcs_alloc_end(bool ok, uint64_t key, int kind, int ordinal, uint64_t size)
{
	if (ok)
		hcs_track(key, kind, ordinal, size); /* a full table keeps it counted: conservative */
	else
		hcs_unreserve(ordinal, size);
	hcs_in_hook--;
}

/* A pitched allocation, once the driver chose the pitch: charge or give back the difference
 * between the estimate reserved before the call and what it took. false: the rest does not
 * fit (the caller frees it and refuses). */
static inline bool hcs_settle(int ordinal, uint64_t estimate, uint64_t actual)
{
	if (actual > estimate)
		return hcs_reserve(ordinal, actual - estimate) == 0;
	if (actual < estimate)
		hcs_unreserve(ordinal, estimate - actual);
	return true;
}

/* Frees: take the entry out first (so two racing frees cannot both credit it), put it back if
 * the real free fails. Unknown keys pass through and are counted as such. */
static inline bool hcs_free_begin(uint64_t key, int kind, int *ordinal, uint64_t *size)
{
	hcs_in_hook++;
	return hcs_untrack(key, kind, ordinal, size);
}

static inline void hcs_free_end(bool tracked, bool ok, uint64_t key, int kind, int ordinal,
				uint64_t size)
{
	if (tracked) {
		if (ok)
			hcs_unreserve(ordinal, size);
		else
			hcs_track(key, kind, ordinal, size);
	}
	hcs_in_hook--;
}

/* What a memory-info call reports inside the quota. */
static inline void hcs_clamp_info(int ordinal, size_t *free_bytes, size_t *total_bytes)
{
	uint64_t limit = hcs_limit_of(ordinal);
	if (limit == UINT64_MAX || !total_bytes || !free_bytes)
		return;
	uint64_t used = hcs_used_of(ordinal);
	uint64_t room = used < limit ? limit - used : 0;
	if (*total_bytes > limit)
		*total_bytes = (size_t)limit;
	if (*free_bytes > room)
		*free_bytes = (size_t)room;
}

/* Real-function pointers and their resolution, once per backend, from its rows. */
#define HCS_DECLARE_REAL(v, ret, name, params, ...) static ret(*real_##name) params;
#define HCS_RESOLVE_REAL(v, ret, name, ...)                                                  \
	real_##name = (__typeof__(real_##name))hcs_real(v##_libraries, #name);
#define HCS_BACKEND(v, rows, helpers)                                                        \
	rows(HCS_DECLARE_REAL) helpers(HCS_DECLARE_REAL)                                     \
	static pthread_once_t v##_once = PTHREAD_ONCE_INIT;                                  \
	static void v##_resolve(void) { rows(HCS_RESOLVE_REAL) helpers(HCS_RESOLVE_REAL) }   \
	static inline void v##_ready(void) { pthread_once(&v##_once, v##_resolve); }

/* The allocate bracket: reserve on the current device, call, track the key or give back. */
#define HCS_ALLOC_BRACKET(v, name, args, kind, key, size)                                    \
	v##_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_##v;                                                      \
	if (!hcs_enforcing())                                                                \
		return real_##name args;                                                     \
	HCS_ALLOC_ON(v, name, args, kind, key, size, v##_ordinal())

/* Its second half, for hooks that know the device themselves (a VMM or pool location). */
#define HCS_ALLOC_ON(v, name, args, kind, key, size, device)                                 \
	int device_ = (device);                                                              \
	if (hcs_alloc_begin(device_, (size)) != 0)                                           \
		return HCS_OOM_##v;                                                          \
	__auto_type rc_ = real_##name args;                                                  \
	hcs_alloc_end(rc_ == HCS_OK_##v, rc_ == HCS_OK_##v ? (uint64_t)(key) : 0, kind,      \
		      device_, (size));                                                      \
	return rc_

/* The free bracket: untrack, call, credit (or track again if the driver refused). */
#define HCS_FREE_BRACKET(v, name, args, kind, key)                                           \
	v##_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_##v;                                                      \
	int device_;                                                                         \
	uint64_t size_;                                                                      \
	bool tracked_ = hcs_free_begin((uint64_t)(key), kind, &device_, &size_);             \
	__auto_type rc_ = real_##name args;                                                  \
	hcs_free_end(tracked_, rc_ == HCS_OK_##v, (uint64_t)(key), kind, device_, size_);    \
	return rc_

/* Memory info: the driver's answer, clamped to the quota of the current device. */
#define HCS_INFO_BRACKET(v, name, args, free_bytes, total_bytes)                             \
	v##_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_##v;                                                      \
	__auto_type rc_ = real_##name args;                                                  \
	if (rc_ == HCS_OK_##v && hcs_cfg.enforcing)                                          \
		hcs_clamp_info(v##_ordinal(), free_bytes, total_bytes);                      \
	return rc_

/* One hook body per row, chosen by its role. */
#define HCS_DEFINE_HOOK(v, ret, name, params, args, role, a, b, c)                           \
	HCS_HOOK_##role(v, ret, name, params, args, a, b, c)
#define HCS_HOOK_CUSTOM(...)
#define HCS_HOOK_ALLOC(v, ret, name, params, args, kind, key, size)                          \
	ret hcs_##name params { HCS_ALLOC_BRACKET(v, name, args, kind, key, size); }
#define HCS_HOOK_FREE(v, ret, name, params, args, kind, key, unused)                         \
	ret hcs_##name params { HCS_FREE_BRACKET(v, name, args, kind, key); }
#define HCS_HOOK_INFO(v, ret, name, params, args, unused, free_bytes, total_bytes)           \
	ret hcs_##name params { HCS_INFO_BRACKET(v, name, args, free_bytes, total_bytes); }

/* For rows whose backend has no helpers. */
#define HCS_NO_HELPERS(Y)

#endif
