/* The compute share (limiter.c): launches on a device whose share is below 100% are paced
 * and measured. The CUDA backend brackets every launch with these calls. */
#ifndef HCS_LIMITER_H
#define HCS_LIMITER_H

#include "hcs_abi.h"

/* The share (1..99) of the current device, its ordinal in *device; 0 when not limited. */
int hcs_compute_share(int *device);
/* Before a launch: sleep while the device time used in this window exceeds the share. */
void hcs_throttle(int device, int share);
/* Around a launch: an event pair on its stream (-1 when the pool is exhausted). */
int hcs_pair_begin(int device, CUstream stream);
void hcs_pair_end(int index, CUstream stream);

/* The launch bracket (role LAUNCH in symbols.h): unlimited devices go straight through. */
#define HCS_LAUNCH_BRACKET(v, name, args, stream)                                            \
	v##_ready();                                                                         \
	if (!real_##name)                                                                    \
		return HCS_MISSING_##v;                                                      \
	int device_, share_ = hcs_compute_share(&device_);                                   \
	if (!share_)                                                                         \
		return real_##name args;                                                     \
	hcs_in_hook++;                                                                       \
	hcs_throttle(device_, share_);                                                       \
	int pair_ = hcs_pair_begin(device_, stream);                                         \
	__auto_type rc_ = real_##name args;                                                  \
	hcs_pair_end(pair_, stream);                                                         \
	hcs_in_hook--;                                                                       \
	return rc_
#define HCS_HOOK_LAUNCH(v, ret, name, params, args, unused, stream, unused2)                 \
	ret hcs_##name params { HCS_LAUNCH_BRACKET(v, name, args, stream); }

#endif
