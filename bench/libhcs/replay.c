/* Accounting accuracy on a replayed allocation trace: PyTorch caching-allocator-like sizes
 * (512-byte rounding, 2 MiB small-block segments, 20 MiB large segments, big tensors), VMM
 * cuMemCreate/cuMemRelease (expandable segments) and stream-ordered alloc/free. After every
 * step, the quota's free bytes must equal the limit minus the true sum of live blocks.
 * Prints: steps, mismatches, peak live bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef unsigned long long CUdeviceptr, Handle;
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
int cuMemCreate(Handle *, size_t, const void *, unsigned long long);
int cuMemRelease(Handle);
int cuMemGetInfo_v2(size_t *, size_t *);

#define LIVE 4096
struct block { unsigned long long key; uint64_t size; int kind; };

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200000;
	static struct block live[LIVE];
	int count = 0;
	uint64_t truth = 0, peak = 0, state = 42;
	long mismatches = 0, refused = 0;
	int prop[8] = {1, 0, 1, 0, 0, 0, 0, 0};
	size_t free_bytes, total;
	cuMemGetInfo_v2(&free_bytes, &total);
	for (long s = 0; s < steps; s++) {
		state ^= state << 13; state ^= state >> 7; state ^= state << 17;
		int release = count && (count == LIVE || (state & 7) < 3);
		if (release) {
			int i = (int)((state >> 3) % (uint64_t)count);
			struct block b = live[i];
			live[i] = live[--count];
			int rc = b.kind == 0 ? cuMemFree_v2(b.key)
			       : b.kind == 1 ? cuMemFreeAsync(b.key, 0) : cuMemRelease(b.key);
			if (rc == 0)
				truth -= b.size;
		} else {
			uint64_t pick = (state >> 8) % 100, size;
			if (pick < 60)
				size = 2ULL << 20;                      /* small-block segment */
			else if (pick < 85)
				size = 20ULL << 20;                     /* large-block segment */
			else if (pick < 95)
				size = (((state >> 16) % (256ULL << 20)) + 511) & ~511ULL; /* tensor */
			else
				size = 2ULL << 20;                      /* VMM granule */
			int kind = pick >= 95 ? 2 : (pick % 2);
			unsigned long long key = 0;
			int rc = kind == 0 ? cuMemAlloc_v2(&key, size)
			       : kind == 1 ? cuMemAllocAsync(&key, size, 0)
					   : cuMemCreate(&key, size, prop, 0);
			if (rc == 0) {
				live[count++] = (struct block){key, size, kind};
				truth += size;
				if (truth > peak) peak = truth;
			} else {
				refused++;
			}
		}
		cuMemGetInfo_v2(&free_bytes, &total);
		if (free_bytes != total - truth)
			mismatches++;
	}
	printf("%ld %ld %llu %ld\n", steps, mismatches, (unsigned long long)peak, refused);
	return mismatches != 0;
}
