/* Generated from the table in hcsd/contract/kmsg_needles.py: do not edit.
 * Regenerate with `python -m hcsd.contract.kmsg_needles > bpf/kmsg_needles.h`;
 * tests/contract/test_kmsg_needles.py fails when it is stale. Include after kmsg.h. */
#ifndef HCS_KMSG_NEEDLES_H
#define HCS_KMSG_NEEDLES_H

#define HCS_KMSG_AT(msg, i) ((msg)[(i) & (HCS_MSG_MAX - 1)])
#define HCS_KMSG_INLINE static inline __attribute__((always_inline))
#define HCS_NEEDLE_COUNT 7

/* After a "[...]" group of digits, spaces, '.', 'T' or 'C' at position; else position. */
HCS_KMSG_INLINE unsigned int
hcs_skip_group(const char *msg, unsigned int len, unsigned int position)
{
	if (position >= len || HCS_KMSG_AT(msg, position) != '[')
		return position;
#pragma unroll
	for (unsigned int offset = 1; offset <= 24; offset++) {
		unsigned int index = position + offset;
		if (index >= len)
			return position;
		char c = HCS_KMSG_AT(msg, index);
		if (c == ']')
			return index + 1;
		if (!((c >= '0' && c <= '9') || c == ' ' || c == '.' || c == 'C' || c == 'T'))
			return position;
	}
	return position;
}

/* Where the message proper begins: after the console's "[time]" and "[caller]" groups. */
HCS_KMSG_INLINE unsigned int hcs_message_start(const char *msg, unsigned int len)
{
	unsigned int position = 0;
	position = hcs_skip_group(msg, len, position);
	position = hcs_skip_group(msg, len, position);
	if (position && position < len && HCS_KMSG_AT(msg, position) == ' ')
		position++;
	return position;
}

/* Where the text after a "<driver> <device>: " prefix begins; 0 when there is none. */
HCS_KMSG_INLINE unsigned int
hcs_device_end(const char *msg, unsigned int len, unsigned int start)
{
#pragma unroll
	for (unsigned int offset = 0; offset < 64; offset++) {
		unsigned int index = start + offset;
		if (index + 1 >= len)
			break;
		if (HCS_KMSG_AT(msg, index) == ':' && HCS_KMSG_AT(msg, index + 1) == ' ')
			return index + 2;
	}
	return 0;
}

/* 1 + the index of the needle standing where it may; 0 when none does. `positions` (2 entries)
 * is where the two offsets pass through memory: in eBPF, a per-CPU map's value, so the verifier
 * sees one unknown offset instead of following each possible one as its own path (which
 * would run past its instruction limit). */
HCS_KMSG_INLINE unsigned int
hcs_kmsg_needle(const char *msg, unsigned int len, volatile unsigned int *positions)
{
	positions[0] = hcs_message_start(msg, len);
	unsigned int start = positions[0];
	positions[1] = hcs_device_end(msg, len, start);
	unsigned int device = positions[1];
	/* "NVRM: Xid" at the start: nvidia */
	if (start + 9 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'N' &&
	    HCS_KMSG_AT(msg, start + 1) == 'V' &&
	    HCS_KMSG_AT(msg, start + 2) == 'R' &&
	    HCS_KMSG_AT(msg, start + 3) == 'M' &&
	    HCS_KMSG_AT(msg, start + 4) == ':' &&
	    HCS_KMSG_AT(msg, start + 5) == ' ' &&
	    HCS_KMSG_AT(msg, start + 6) == 'X' &&
	    HCS_KMSG_AT(msg, start + 7) == 'i' &&
	    HCS_KMSG_AT(msg, start + 8) == 'd')
		return 1;
	/* "amdgpu" at the start: hygon (amdgpu-derived driver) */
	if (start + 6 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'a' &&
	    HCS_KMSG_AT(msg, start + 1) == 'm' &&
	    HCS_KMSG_AT(msg, start + 2) == 'd' &&
	    HCS_KMSG_AT(msg, start + 3) == 'g' &&
	    HCS_KMSG_AT(msg, start + 4) == 'p' &&
	    HCS_KMSG_AT(msg, start + 5) == 'u')
		return 2;
	/* "AER:" at the start: PCIe AER, after the port's prefix */
	if (start + 4 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'A' &&
	    HCS_KMSG_AT(msg, start + 1) == 'E' &&
	    HCS_KMSG_AT(msg, start + 2) == 'R' &&
	    HCS_KMSG_AT(msg, start + 3) == ':')
		return 3;
	/* "AER:" after a device prefix: PCIe AER, after the port's prefix */
	if (device && device + 4 <= len &&
	    HCS_KMSG_AT(msg, device + 0) == 'A' &&
	    HCS_KMSG_AT(msg, device + 1) == 'E' &&
	    HCS_KMSG_AT(msg, device + 2) == 'R' &&
	    HCS_KMSG_AT(msg, device + 3) == ':')
		return 3;
	/* "davinci" at the start: ascend */
	if (start + 7 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'd' &&
	    HCS_KMSG_AT(msg, start + 1) == 'a' &&
	    HCS_KMSG_AT(msg, start + 2) == 'v' &&
	    HCS_KMSG_AT(msg, start + 3) == 'i' &&
	    HCS_KMSG_AT(msg, start + 4) == 'n' &&
	    HCS_KMSG_AT(msg, start + 5) == 'c' &&
	    HCS_KMSG_AT(msg, start + 6) == 'i')
		return 4;
	/* "devdrv" at the start: ascend */
	if (start + 6 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'd' &&
	    HCS_KMSG_AT(msg, start + 1) == 'e' &&
	    HCS_KMSG_AT(msg, start + 2) == 'v' &&
	    HCS_KMSG_AT(msg, start + 3) == 'd' &&
	    HCS_KMSG_AT(msg, start + 4) == 'r' &&
	    HCS_KMSG_AT(msg, start + 5) == 'v')
		return 5;
	/* "cambricon" at the start: cambricon */
	if (start + 9 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'c' &&
	    HCS_KMSG_AT(msg, start + 1) == 'a' &&
	    HCS_KMSG_AT(msg, start + 2) == 'm' &&
	    HCS_KMSG_AT(msg, start + 3) == 'b' &&
	    HCS_KMSG_AT(msg, start + 4) == 'r' &&
	    HCS_KMSG_AT(msg, start + 5) == 'i' &&
	    HCS_KMSG_AT(msg, start + 6) == 'c' &&
	    HCS_KMSG_AT(msg, start + 7) == 'o' &&
	    HCS_KMSG_AT(msg, start + 8) == 'n')
		return 6;
	/* "cndrv" at the start: cambricon */
	if (start + 5 <= len &&
	    HCS_KMSG_AT(msg, start + 0) == 'c' &&
	    HCS_KMSG_AT(msg, start + 1) == 'n' &&
	    HCS_KMSG_AT(msg, start + 2) == 'd' &&
	    HCS_KMSG_AT(msg, start + 3) == 'r' &&
	    HCS_KMSG_AT(msg, start + 4) == 'v')
		return 7;
	return 0;
}

#endif
