// SPDX-License-Identifier: GPL-2.0
/* PCIe AER and memory-controller errors from the ras tracepoints.
 *
 * Kernels without AER support have no ras:aer_event; the loader then disables that program
 * (autoload off) and keeps the other. The AER record is declared locally (libbpf matches it to
 * the kernel's trace_event_raw_aer_event by name, ignoring the ___hcs suffix), so this file
 * builds even where the build machine's BTF lacks it.
 */
#include "common.bpf.h"
#include "ras.h"

char LICENSE[] SEC("license") = "GPL";

struct trace_event_raw_aer_event___hcs {
	struct trace_entry ent;
	u32 __data_loc_dev_name;
	u32 status;
	u8 severity;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

HCS_COUNTER_MAP(counters);

SEC("tp/ras/aer_event")
int hcs_aer(struct trace_event_raw_aer_event___hcs *ctx)
{
	hcs_count(&counters, HCS_SEEN);
	struct hcs_ras_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		hcs_count(&counters, HCS_DROPPED);
		return 0;
	}
	__u32 location = BPF_CORE_READ(ctx, __data_loc_dev_name);
	__u32 length = location >> 16;
	if (length > HCS_DEV_NAME - 1)
		length = HCS_DEV_NAME - 1;
	__builtin_memset(e->dev_name, 0, sizeof(e->dev_name));
	bpf_probe_read_kernel(e->dev_name, length & (HCS_DEV_NAME - 1),
			      (void *)ctx + (location & 0xffff));
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = HCS_RAS_AER;
	e->status = BPF_CORE_READ(ctx, status);
	e->severity = BPF_CORE_READ(ctx, severity);
	e->count = 1;
	hcs_count(&counters, HCS_MATCHED);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp/ras/mc_event")
int hcs_mc(struct trace_event_raw_mc_event *ctx)
{
	hcs_count(&counters, HCS_SEEN);
	struct hcs_ras_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		hcs_count(&counters, HCS_DROPPED);
		return 0;
	}
	__builtin_memset(e->dev_name, 0, sizeof(e->dev_name));
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = HCS_RAS_MC;
	e->status = BPF_CORE_READ(ctx, error_type);
	e->severity = 0;
	e->count = BPF_CORE_READ(ctx, error_count);
	hcs_count(&counters, HCS_MATCHED);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
