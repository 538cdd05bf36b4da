/* The shape every allocation and free hook shares, kept in one place. */
#ifndef HCS_COMMON_H
#define HCS_COMMON_H

#include "hcs_abi.h"
#include "internal.h"

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

#define HCS_RESOLVE(libs, name) (real_##name = (__typeof__(real_##name))hcs_real(libs, #name))

#endif
