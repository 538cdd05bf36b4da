/* The kernel filters' matcher (bpf/kmsg_needles.h) compiled for user space: for each line on
 * stdin, prints 1 + the index of the needle it finds (0 for none), as bpf/kmsg.bpf.c would. */
#include <stdio.h>
#include <string.h>

#include "kmsg.h"
#include "kmsg_needles.h"

int main(void)
{
	static char line[HCS_MSG_MAX * 4];
	while (fgets(line, sizeof(line), stdin)) {
		size_t length = strcspn(line, "\n");
		char msg[HCS_MSG_MAX] = {0};
		/* as the eBPF program: at most HCS_MSG_MAX - 1 bytes of the line */
		unsigned int len = length > HCS_MSG_MAX - 1 ? HCS_MSG_MAX - 1 : (unsigned int)length;
		memcpy(msg, line, len);
		volatile unsigned int positions[2];
		printf("%u\n", hcs_kmsg_needle(msg, len, positions));
	}
	return 0;
}
