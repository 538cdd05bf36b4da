// SPDX-License-Identifier: GPL-2.0
/* Candidate kernel log lines, filtered in the kernel.
 *
 * Attached to printk's console tracepoint as a raw tracepoint (BPF_RAW_TRACEPOINT_OPEN), so
 * neither tracefs nor perf_event_open is needed: Debian's kernels keep perf_event_open for
 * CAP_SYS_ADMIN under their default kernel.perf_event_paranoid=3, while a raw tracepoint needs
 * CAP_BPF and CAP_PERFMON only (docs/packaging.md). A line is passed to user space only when a
 * vendor's marker stands where that vendor's lines have it: at the start of the message (NVIDIA
 * Xid, amdgpu, Ascend and Cambricon driver prefixes) or right after the device prefix (PCIe
 * AER). Never anywhere in the line: the kernel prints text users control (a segfault line
 * names the faulting file), so a chatty kernel costs hcsd nothing and a user cannot pass a
 * forged fault line to it. The matcher is generated from the Python table
 * (hcsd/contract/kmsg_needles.py -> kmsg_needles.h).
 */
#include "common.bpf.h"
#include "kmsg.h"
#include "kmsg_needles.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hcs_kmsg_event);
} scratch SEC(".maps");

/* Offsets the matcher passes through memory (see hcs_kmsg_needle). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32[2]);
} positions SEC(".maps");

HCS_COUNTER_MAP(counters);

/* trace_console(text, len): the arguments, not the tracepoint's record. */
SEC("raw_tp/console")
int hcs_console(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	struct hcs_kmsg_event *e = bpf_map_lookup_elem(&scratch, &zero);
	__u32 *offsets = bpf_map_lookup_elem(&positions, &zero);
	if (!e || !offsets)
		return 0;
	hcs_count(&counters, HCS_SEEN);
	const char *text = (const char *)ctx->args[0];
	__u64 length = ctx->args[1];
	/* As the tracepoint's record does: drop the newline kernels before 5.19 end the text with. */
	char last = 0;
	if (length && !bpf_probe_read_kernel(&last, 1, text + length - 1) && last == '\n')
		length--;
	e->truncated = length > HCS_MSG_MAX - 1;
	if (length > HCS_MSG_MAX - 1)
		length = HCS_MSG_MAX - 1;
	if (bpf_probe_read_kernel(e->msg, length & (HCS_MSG_MAX - 1), text))
		return 0;
	e->len = length;
	e->ts_ns = bpf_ktime_get_ns();
	__u32 found = hcs_kmsg_needle(e->msg, e->len, offsets);
	if (!found)
		return 0;
	e->needle = found;
	hcs_count(&counters, HCS_MATCHED);
	if (bpf_ringbuf_output(&events, e, sizeof(*e), 0))
		hcs_count(&counters, HCS_DROPPED);
	return 0;
}
