/* hcs-region: the usage region from the outside, with libhcs's own format code (src/region.c).
 *   hcs-region check FILE   exit 0 if libhcs accepts FILE as a usage region, else 1 and why
 *   hcs-region init FILE    create FILE as an initialised empty region (exactly what hcsd
 *                           writes); refuses to replace an existing file
 *   hcs-region show FILE    the container's usage per device and its live process slots
 * For hcsd's tests (a region written by Python must be accepted, byte for byte equal to
 * `init`'s) and for looking at a container's usage by hand. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "region.h"

static int usage(void)
{
	fprintf(stderr, "usage: hcs-region check|init|show FILE\n");
	return 2;
}

static int show(const struct hcs_region *r)
{
	printf("lock %s, %llu processes reclaimed, %llu allocations refused for want of a slot\n",
	       r->lock_state == HCS_REGION_LOCK_READY ? "ready" : "not set up",
	       (unsigned long long)r->reclaimed_processes,
	       (unsigned long long)r->refused_without_slot);
	for (int d = 0; d < HCS_REGION_MAX_DEVICES; d++)
		if (r->used[d])
			printf("device %d: %llu bytes used\n", d, (unsigned long long)r->used[d]);
	for (int s = 0; s < HCS_REGION_MAX_PROCS; s++) {
		const struct hcs_region_proc *p = &r->procs[s];
		if (!p->pid)
			continue;
		printf("slot %d: pid %d", s, p->pid);
		for (int d = 0; d < HCS_REGION_MAX_DEVICES; d++)
			if (p->used[d])
				printf(", device %d %llu bytes", d, (unsigned long long)p->used[d]);
		printf("\n");
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return usage();
	const char *command = argv[1], *path = argv[2];
	char why[1000];
	if (strcmp(command, "init") == 0) {
		if (hcs_region_create(path, why, sizeof(why)) != 0) {
			fprintf(stderr, "hcs-region: %s\n", why);
			return 1;
		}
		return 0;
	}
	if (strcmp(command, "check") != 0 && strcmp(command, "show") != 0)
		return usage();
	struct hcs_region *r = hcs_region_open(path, false, why, sizeof(why));
	if (!r) {
		fprintf(stderr, "hcs-region: %s\n", why);
		return 1;
	}
	int rc = strcmp(command, "show") == 0 ? show(r) : (printf("%s: a valid region\n", path), 0);
	munmap(r, sizeof(*r));
	return rc;
}
