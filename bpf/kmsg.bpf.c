// SPDX-License-Identifier: GPL-2.0
/* Candidate kernel log lines, filtered in the kernel.
 *
 * Attached to the printk:console tracepoint. A line is passed to user space only when it
 * contains one of the needles (NVIDIA Xid, amdgpu, PCIe AER, Ascend and Cambricon driver
 * prefixes), so a chatty kernel costs hcsd nothing. Needles are const volatile: user space may
 * replace them before load.
 */
#include "common.bpf.h"
#include "kmsg.h"

char LICENSE[] SEC("license") = "GPL";

const volatile char needles[HCS_NEEDLES][HCS_NEEDLE_LEN] = {
	"NVRM: Xid", "amdgpu", "AER:", "davinci", "devdrv", "cambricon", "cndrv", "",
};
const volatile __u8 needle_lens[HCS_NEEDLES] = { 9, 6, 4, 7, 6, 9, 5, 0 };

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

HCS_COUNTER_MAP(counters);

struct match_ctx {
	struct hcs_kmsg_event *event;
	__u32 found;
};

static long match_at(__u32 at, struct match_ctx *m)
{
	struct hcs_kmsg_event *e = m->event;
	for (int n = 0; n < HCS_NEEDLES; n++) {
		__u32 length = needle_lens[n];
		if (!length || length > HCS_NEEDLE_LEN || at + length > e->len)
			continue;
		int same = 1;
		for (int k = 0; k < HCS_NEEDLE_LEN; k++) {
			if (k >= length)
				break;
			if (e->msg[(at + k) & (HCS_MSG_MAX - 1)] != needles[n][k]) {
				same = 0;
				break;
			}
		}
		if (same) {
			m->found = n + 1;
			return 1;
		}
	}
	return 0;
}

SEC("tp/printk/console")
int hcs_console(struct trace_event_raw_console *ctx)
{
	__u32 zero = 0;
	struct hcs_kmsg_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	hcs_count(&counters, HCS_SEEN);
	__u32 location = BPF_CORE_READ(ctx, __data_loc_msg);
	__u32 offset = location & 0xffff;
	__u32 length = location >> 16;
	e->truncated = length > HCS_MSG_MAX - 1;
	if (length > HCS_MSG_MAX - 1)
		length = HCS_MSG_MAX - 1;
	if (bpf_probe_read_kernel(e->msg, length & (HCS_MSG_MAX - 1), (void *)ctx + offset))
		return 0;
	e->len = length;
	e->ts_ns = bpf_ktime_get_ns();
	struct match_ctx m = { .event = e, .found = 0 };
	bpf_loop(HCS_MSG_MAX, match_at, &m, 0);
	if (!m.found)
		return 0;
	e->needle = m.found;
	hcs_count(&counters, HCS_MATCHED);
	if (bpf_ringbuf_output(&events, e, sizeof(*e), 0))
		hcs_count(&counters, HCS_DROPPED);
	return 0;
}
