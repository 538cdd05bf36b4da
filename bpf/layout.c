/* Prints the event layouts as C sees them, for the test that checks the Python mirrors. */
#include <stddef.h>
#include <stdio.h>
#include "kmsg.h"
#include "ras.h"

int main(void)
{
	printf("hcs_kmsg_event %zu ts_ns=%zu len=%zu needle=%zu truncated=%zu msg=%zu\n",
	       sizeof(struct hcs_kmsg_event), offsetof(struct hcs_kmsg_event, ts_ns),
	       offsetof(struct hcs_kmsg_event, len), offsetof(struct hcs_kmsg_event, needle),
	       offsetof(struct hcs_kmsg_event, truncated), offsetof(struct hcs_kmsg_event, msg));
	printf("hcs_ras_event %zu ts_ns=%zu kind=%zu status=%zu severity=%zu count=%zu "
	       "dev_name=%zu\n",
	       sizeof(struct hcs_ras_event), offsetof(struct hcs_ras_event, ts_ns),
	       offsetof(struct hcs_ras_event, kind), offsetof(struct hcs_ras_event, status),
	       offsetof(struct hcs_ras_event, severity), offsetof(struct hcs_ras_event, count),
	       offsetof(struct hcs_ras_event, dev_name));
	return 0;
}
