/* Event from kmsg.bpf.c: one candidate kernel log line. Shared with user space (Python mirrors
 * this layout; a test checks sizeof against it). */
#ifndef HCS_KMSG_H
#define HCS_KMSG_H

#define HCS_MSG_MAX 256     /* bytes of the line kept; longer lines are cut (flag set) */

struct hcs_kmsg_event {
	unsigned long long ts_ns;   /* bpf_ktime_get_ns() when the line was printed */
	unsigned int len;           /* bytes in msg */
	unsigned short needle;      /* 1 + index of the matching needle */
	unsigned short truncated;   /* 1 when the line was longer than HCS_MSG_MAX - 1 */
	char msg[HCS_MSG_MAX];
};

#endif
