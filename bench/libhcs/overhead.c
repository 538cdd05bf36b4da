/* Cost of a cuMemAlloc_v2 + cuMemFree_v2 pair over the fake driver: run with and without
 * libhcs preloaded. Prints the median ns per pair over ROUNDS rounds of PAIRS pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);

static int compare(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long pairs = argc > 1 ? atol(argv[1]) : 200000;
	int rounds = argc > 2 ? atoi(argv[2]) : 9;
	double ns[64];
	CUdeviceptr p;
	for (int r = 0; r < rounds && r < 64; r++) {
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		for (long i = 0; i < pairs; i++) {
			if (cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p))
				return 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &b);
		ns[r] = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / pairs;
	}
	qsort(ns, rounds, sizeof(double), compare);
	printf("%.1f\n", ns[rounds / 2]);
	return 0;
}
