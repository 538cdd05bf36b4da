/* The compute share: launching 1 ms kernels as fast as the queue takes them for 1.5 s, the
 * device is busy about `EXPECT_SHARE` percent of the time (direct launches, cuGetProcAddress
 * launches, graph launches, cooperative launches and the per-thread-default-stream entry
 * points alike). Run with HCS_CONFIG whose compute_percent is set. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuLaunchKernel(void *, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuGraphLaunch(void *, CUstream);
CUresult cuGraphLaunch_ptsz(void *, CUstream);
CUresult cuLaunchCooperativeKernel(void *, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, CUstream, void **);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
long long fakeBusyNanos(void);
long long fakeTimelineEnd(void);
long long fakeNow(void);

typedef CUresult (*launch_fn)(void *, unsigned int, unsigned int, unsigned int, unsigned int,
			      unsigned int, unsigned int, unsigned int, CUstream, void **, void **);

static double busy_fraction(int how)
{
	launch_fn resolved = NULL, per_thread = NULL;
	cuGetProcAddress("cuLaunchKernel", (void **)&resolved, 12000, 0);
	cuGetProcAddress("cuLaunchKernel", (void **)&per_thread, 12000,
			 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	long long start = fakeNow(), busy0 = fakeBusyNanos();
	while (fakeNow() - start < 1500000000LL) {
		CUresult rc = how == 0 ? cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)
			    : how == 1 ? resolved(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)
			    : how == 2 ? cuGraphLaunch(NULL, NULL)
			    : how == 3 ? cuLaunchCooperativeKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL)
			    : how == 4 ? per_thread(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)
				       : cuGraphLaunch_ptsz(NULL, NULL);
		if (rc != 0)
			return -1;
	}
	long long end = fakeTimelineEnd() > fakeNow() ? fakeTimelineEnd() : fakeNow();
	return (double)(fakeBusyNanos() - busy0) / (double)(end - start);
}

/* COMPUTE_PROCS processes of one container launching at once share the budget: together
 * they keep the device about `EXPECT_SHARE` busy, not that much each. */
static int together(int processes, double expect)
{
	int results[2];
	if (pipe(results))
		return 2;
	for (int i = 0; i < processes; i++) {
		if (fork() == 0) {
			double fraction = busy_fraction(0);
			_exit(write(results[1], &fraction, sizeof(fraction)) == sizeof(fraction) ? 0 : 1);
		}
	}
	double total = 0;
	for (int i = 0; i < processes; i++) {
		double fraction = 0;
		CHECK(read(results[0], &fraction, sizeof(fraction)) == sizeof(fraction), "result %d", i);
		total += fraction;
		wait(NULL);
	}
	printf("# %d processes together: device busy %.1f%% (share %.0f%%)\n", processes,
	       total * 100, expect * 100);
	CHECK(total > expect - 0.07 && total < expect + 0.07,
	      "%d processes at a %.0f%% share kept the device %.1f%% busy together", processes,
	      expect * 100, total * 100);
	return check_done("compute-share-shared");
}

int main(void)
{
	double expect = atof(getenv("EXPECT_SHARE")) / 100.0;
	const char *processes = getenv("COMPUTE_PROCS");
	if (processes)
		return together(atoi(processes), expect);
	const char *names[] = {"cuLaunchKernel", "cuGetProcAddress launch", "cuGraphLaunch",
			       "cuLaunchCooperativeKernel", "cuGetProcAddress per-thread launch",
			       "cuGraphLaunch_ptsz"};
	for (int how = 0; how < 6; how++) {
		double fraction = busy_fraction(how);
		printf("# %s: device busy %.1f%% (share %.0f%%)\n", names[how], fraction * 100,
		       expect * 100);
		/* Unlimited: only "not paced" is checked (a loaded test machine cannot always keep
		 * the fake's queue full); limited: within 7 points of the share. */
		CHECK(expect >= 1.0 ? fraction > 0.85
				    : fraction > expect - 0.07 && fraction < expect + 0.07,
		      "%s: busy %.3f, expected about %.2f", names[how], fraction, expect);
	}
	return check_done("compute-share");
}
