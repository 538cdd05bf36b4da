/* Helpers shared by HCS's eBPF programs. */
#ifndef HCS_COMMON_BPF_H
#define HCS_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

/* Per-CPU counters that user space reads to report seen / matched / dropped events. */
enum hcs_counter { HCS_SEEN = 0, HCS_MATCHED = 1, HCS_DROPPED = 2, HCS_COUNTERS = 3 };

#define HCS_COUNTER_MAP(name)                                      \
	struct {                                                       \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                   \
		__uint(max_entries, HCS_COUNTERS);                         \
		__type(key, __u32);                                        \
		__type(value, __u64);                                      \
	} name SEC(".maps")

static __always_inline void hcs_count(void *map, __u32 which)
{
	__u64 *value = bpf_map_lookup_elem(map, &which);
	if (value)
		*value += 1;
}

#endif
