/* A minimal TAP-like checker: each CHECK prints ok/not ok; main returns the failure count and
 * prints `RESULT <passed> <failed>` for the runner to add up. */
#ifndef HCS_CHECK_H
#define HCS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

#define CHECK(condition, ...)                                                                 \
	do {                                                                                 \
		if (condition) {                                                             \
			check_passed++;                                                      \
		} else {                                                                     \
			check_failed++;                                                      \
			printf("not ok %s:%d: ", __FILE__, __LINE__);                        \
			printf(__VA_ARGS__);                                                 \
			printf("\n");                                                        \
		}                                                                            \
	} while (0)

static inline int check_done(const char *name)
{
	printf("RESULT %s %d %d\n", name, check_passed, check_failed);
	fflush(stdout);
	return check_failed ? 1 : 0;
}

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

#endif
