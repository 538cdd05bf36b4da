/* Prints what libhcs's own quota.conf parser (src/config.c, hcs_parse_config_text) reads from a
 * file, for the contract test that feeds it files written by hcsd (tests/contract/).
 *   dump_config FILE  ->  "ok devices=N" and one "device I uuid=U vram_limit=B compute_percent=P"
 *                         line per device, exit 0; or "error: WHY", exit 1.
 * The whole file is handed to the parser; hcsd's writer keeps files below the loader's size. */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: dump_config FILE\n");
		return 2;
	}
	FILE *file = fopen(argv[1], "rb");
	if (!file) {
		perror(argv[1]);
		return 2;
	}
	static char text[1 << 20];
	size_t got = fread(text, 1, sizeof(text) - 1, file);
	fclose(file);
	text[got] = 0;
	static struct hcs_config cfg;
	char why[200];
	if (hcs_parse_config_text(text, &cfg, why, sizeof(why)) != 0) {
		printf("error: %s\n", why);
		return 1;
	}
	printf("ok devices=%d\n", cfg.ndevices);
	for (int i = 0; i < cfg.ndevices; i++)
		printf("device %d uuid=%s vram_limit=%llu compute_percent=%d\n", i, cfg.uuid[i],
		       (unsigned long long)cfg.limit[i], cfg.compute_percent[i]);
	return 0;
}
