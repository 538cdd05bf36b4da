/* Threads allocating and freeing random sizes concurrently: the accounting must end at exactly
 * zero and never go past the quota. STRESS_ITERATIONS per thread (default 1,000,000). */
#include <pthread.h>
#include <stdint.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

#define THREADS 8
static long iterations = 1000000;
static long refused[THREADS], failures[THREADS];

static void *worker(void *arg)
{
	long id = (long)arg;
	uint64_t state = 0x9E3779B97F4A7C15ULL * (uint64_t)(id + 1);
	CUdeviceptr held[4] = {0};
	for (long i = 0; i < iterations; i++) {
		state ^= state << 13; state ^= state >> 7; state ^= state << 17;
		int slot = (int)(state & 3);
		if (held[slot]) {
			if (cuMemFree_v2(held[slot]) != 0)
				failures[id]++;
			held[slot] = 0;
		} else {
			size_t size = 1 + (size_t)((state >> 8) % (8 * MiB));
			CUresult rc = cuMemAlloc_v2(&held[slot], size);
			if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
				refused[id]++;
				held[slot] = 0;
			} else if (rc != 0) {
				failures[id]++;
			}
		}
	}
	for (int s = 0; s < 4; s++)
		if (held[s] && cuMemFree_v2(held[s]) != 0)
			failures[id]++;
	return NULL;
}

int main(void)
{
	const char *text = getenv("STRESS_ITERATIONS");
	if (text)
		iterations = atol(text);
	pthread_t threads[THREADS];
	for (long i = 0; i < THREADS; i++)
		pthread_create(&threads[i], NULL, worker, (void *)i);
	long total_refused = 0, total_failures = 0;
	for (long i = 0; i < THREADS; i++) {
		pthread_join(threads[i], NULL);
		total_refused += refused[i];
		total_failures += failures[i];
	}
	size_t f, t;
	cuMemGetInfo_v2(&f, &t);
	CHECK(total_failures == 0, "%ld driver failures", total_failures);
	CHECK(f == t, "accounting ends at exactly zero: free %zu of %zu", f, t);
	printf("# %d threads x %ld iterations, %ld refusals at the %zu MiB quota\n", THREADS,
	       iterations, total_refused, (size_t)(t / MiB));
	CHECK(total_refused > 0, "the quota was hit under contention");
	return check_done("stress");
}
