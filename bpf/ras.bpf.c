// SPDX-License-Identifier: GPL-2.0
/* PCIe AER and memory-controller errors from the ras tracepoints.
 *
 * Raw tracepoints, as in kmsg.bpf.c (no tracefs, no perf_event_open): each program reads the
 * tracepoint's arguments; the ones read here have kept their place in every kernel since 4.x.
 * Kernels without AER support have no aer_event; attaching that program then fails with
 * ENOENT and the loader leaves it out, keeping the other.
 */
#include "common.bpf.h"
#include "ras.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

HCS_COUNTER_MAP(counters);

/* trace_aer_event(dev_name, status, severity, tlp_header_valid, tlp) */
SEC("raw_tp/aer_event")
int hcs_aer(struct bpf_raw_tracepoint_args *ctx)
{
	hcs_count(&counters, HCS_SEEN);
	struct hcs_ras_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		hcs_count(&counters, HCS_DROPPED);
		return 0;
	}
	__builtin_memset(e->dev_name, 0, sizeof(e->dev_name));
	bpf_probe_read_kernel_str(e->dev_name, sizeof(e->dev_name), (const char *)ctx->args[0]);
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = HCS_RAS_AER;
	e->status = (__u32)ctx->args[1];
	e->severity = (__u8)ctx->args[2];
	e->count = 1;
	hcs_count(&counters, HCS_MATCHED);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* trace_mc_event(err_type, error_msg, label, error_count, mc_index, ...) */
SEC("raw_tp/mc_event")
int hcs_mc(struct bpf_raw_tracepoint_args *ctx)
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
	e->status = (__u32)ctx->args[0];
	e->severity = 0;
	e->count = (__u32)(int)ctx->args[3];
	hcs_count(&counters, HCS_MATCHED);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
