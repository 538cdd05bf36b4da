/* One quota for a whole container: processes share the region beside quota.conf. A child is
 * SIGKILLed while holding memory; the next allocation that would not fit reclaims it. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

int main(void)
{
	int ready[2];
	if (pipe(ready))
		return 2;
	CUdeviceptr mine;
	CHECK(cuMemAlloc_v2(&mine, 300 * MiB) == 0, "parent takes 300Mi of the shared 1Gi");
	pid_t holder = fork();
	if (holder == 0) {
		CUdeviceptr p;
		char ok = cuMemAlloc_v2(&p, 500 * MiB) == 0 ? 'y' : 'n';
		if (write(ready[1], &ok, 1) != 1)
			_exit(3);
		pause(); /* holds 500Mi until killed */
		_exit(0);
	}
	char ok = 0;
	CHECK(read(ready[0], &ok, 1) == 1 && ok == 'y', "child takes 500Mi");
	size_t f, t;
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB - 800 * MiB, "both processes count against one quota: free %zu", f);
	pid_t third = fork();
	if (third == 0) {
		CUdeviceptr p;
		_exit(cuMemAlloc_v2(&p, 400 * MiB) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1);
	}
	int status;
	waitpid(third, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a third process is refused 400Mi");
	kill(holder, SIGKILL);
	waitpid(holder, &status, 0);
	CUdeviceptr after;
	CHECK(cuMemAlloc_v2(&after, 600 * MiB) == 0, "the killed process's 500Mi was reclaimed");
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB - 900 * MiB, "usage is exactly ours after reclaim: free %zu", f);
	CHECK(cuMemFree_v2(after) == 0 && cuMemFree_v2(mine) == 0, "frees");
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB, "all credited: free %zu", f);

	/* A killed process that nobody has reaped yet (a zombie) holds nothing either. */
	pid_t zombie = fork();
	if (zombie == 0) {
		CUdeviceptr p;
		char ok = cuMemAlloc_v2(&p, 500 * MiB) == 0 ? 'y' : 'n';
		if (write(ready[1], &ok, 1) != 1)
			_exit(3);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &ok, 1) == 1 && ok == 'y', "another child takes 500Mi");
	kill(zombie, SIGKILL);
	siginfo_t info;
	CHECK(waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT) == 0, "it died, unreaped");
	CHECK(cuMemAlloc_v2(&after, 600 * MiB) == 0, "the zombie's 500Mi was reclaimed");
	CHECK(cuMemFree_v2(after) == 0, "free");
	waitpid(zombie, &status, 0);
	return check_done("multi-process");
}
