/* More processes than the region has slots (256): usage is never under-counted. The 257th
 * live process is refused (the driver's out-of-memory code) until a slot frees, and then
 * allocates normally. Run with HCS_CONFIG (a shared region) and a 1Gi quota. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

#define SLOTS 256

/* A child that allocates `mib` on each byte it reads, answers the result, then waits. */
static pid_t holder(int mib, int requests[2], int answers[2])
{
	pid_t pid = fork();
	if (pid == 0) {
		char ask;
		while (read(requests[0], &ask, 1) == 1) {
			CUdeviceptr p;
			CUresult rc = cuMemAlloc_v2(&p, (size_t)mib * MiB);
			if (write(answers[1], &rc, sizeof(rc)) != sizeof(rc))
				_exit(3);
		}
		_exit(0);
	}
	return pid;
}

static CUresult ask(int requests[2], int answers[2])
{
	CUresult rc = -1;
	if (write(requests[1], "a", 1) != 1 || read(answers[0], &rc, sizeof(rc)) != sizeof(rc))
		return -1;
	return rc;
}

int main(void)
{
	static pid_t children[SLOTS];
	static int requests[SLOTS][2], answers[SLOTS][2];
	CUdeviceptr mine;
	CHECK(cuMemAlloc_v2(&mine, MiB) == 0, "the parent holds a slot and 1Mi");
	int filled = 0;
	for (int i = 0; i < SLOTS - 1; i++) { /* the parent's slot and 255 children's */
		if (pipe(requests[i]) || pipe(answers[i]))
			return 2;
		children[i] = holder(1, requests[i], answers[i]);
		filled += ask(requests[i], answers[i]) == 0;
	}
	CHECK(filled == SLOTS - 1, "%d children hold 1Mi each", filled);
	int last = SLOTS - 1;
	if (pipe(requests[last]) || pipe(answers[last]))
		return 2;
	children[last] = holder(100, requests[last], answers[last]);
	CUresult extra = ask(requests[last], answers[last]);
	CHECK(extra == CUDA_ERROR_OUT_OF_MEMORY, "the 257th process is refused (got %d)", extra);

	/* Whatever the policy, the totals must hold what the processes hold, also after a
	 * reclaim (an allocation that does not fit triggers one). */
	CUdeviceptr big;
	CHECK(cuMemAlloc_v2(&big, GiB) == CUDA_ERROR_OUT_OF_MEMORY, "1Gi does not fit");
	size_t f, t, held = (size_t)SLOTS * MiB + (extra == 0 ? 100 * MiB : 0);
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB - held, "usage counts everything held: free %zu, expected %zu", f,
	      (size_t)(GiB - held));

	kill(children[0], SIGKILL);
	waitpid(children[0], NULL, 0);
	extra = ask(requests[last], answers[last]);
	CHECK(extra == 0, "once a process exits, the 257th gets its slot and allocates (%d)", extra);
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB - (SLOTS - 1) * MiB - 100 * MiB, "and is counted: free %zu", f);
	for (int i = 1; i < SLOTS; i++) {
		kill(children[i], SIGKILL);
		waitpid(children[i], NULL, 0);
	}
	CHECK(cuMemFree_v2(mine) == 0, "free");
	return check_done("slots");
}
