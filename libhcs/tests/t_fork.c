/* Forking while another thread allocates (what Python DataLoader and multiprocessing workers
 * do): every child must complete its first free and allocation instead of hanging on a lock a
 * parent thread held at the fork. FORK_CHILDREN children (default 200), each given 2 s. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static volatile int stop;

static void *churn(void *unused)
{
	(void)unused;
	while (!stop) {
		CUdeviceptr p;
		if (cuMemAlloc_v2(&p, 4096) == 0)
			cuMemFree_v2(p);
	}
	return NULL;
}

/* 1: exited 0; 0: exited otherwise; -1: still running after the timeout (then killed). */
static int finished(pid_t pid, int seconds)
{
	struct timespec pause = {0, 1000000};
	for (long waited = 0; waited < seconds * 1000L; waited++) {
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) == 0;
		nanosleep(&pause, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

int main(void)
{
	const char *text = getenv("FORK_CHILDREN");
	int children = text ? atoi(text) : 200, hung = 0, failed = 0;
	CUdeviceptr held[256];
	for (int i = 0; i < 256; i++)
		if (cuMemAlloc_v2(&held[i], 4096) != 0)
			return 2;
	pthread_t thread;
	pthread_create(&thread, NULL, churn, NULL);
	for (int i = 0; i < children; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			CUdeviceptr mine;
			cuMemFree_v2(held[i % 256]); /* the parent's allocation: not ours to credit */
			int ok = cuMemAlloc_v2(&mine, 4096) == 0 && cuMemFree_v2(mine) == 0;
			_exit(ok ? 0 : 1);
		}
		int result = pid > 0 ? finished(pid, 2) : 0;
		hung += result < 0;
		failed += result == 0;
	}
	stop = 1;
	pthread_join(thread, NULL);
	printf("# %d children forked under allocation load: %d hung, %d failed\n", children, hung,
	       failed);
	CHECK(hung == 0, "%d of %d children hung on their first free", hung, children);
	CHECK(failed == 0, "%d of %d children failed to allocate and free", failed, children);
	return check_done("fork");
}
