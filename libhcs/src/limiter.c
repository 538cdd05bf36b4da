/* Compute share: holds a container near `compute_percent` of a device by delaying launches.
 *
 * Each launch on a limited device is bracketed by two CUDA events on its stream; completed
 * pairs give the device time the container's kernels really took (cuEventElapsedTime). Each
 * process adds its own to the container's budget in the shared region, so the share holds for
 * the container, however many processes launch. Before a launch, if the busy time in the
 * current window exceeds share x window, the launching thread sleeps until it no longer does. No thread is started and nothing runs for devices at 100%.
 * Graph launches are bracketed the same way. Event pairs come from a fixed pool; when it is
 * exhausted, launches go unmeasured rather than unlaunched. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "limiter.h"

#define PAIRS 256
#define WINDOW_NS 100000000LL /* 100 ms: short enough to react, long enough to be smooth */
#define CU_EVENT_DISABLE_TIMING 0x2

typedef void *CUevent;
static const char *const limiter_libraries[] = {"libcuda.so.1", "libcuda.so", NULL};
#define LIMITER_HELPERS(Y)                                                                   \
	Y(limiter, CUresult, cuEventCreate, (CUevent *event, unsigned int flags))            \
	Y(limiter, CUresult, cuEventRecord, (CUevent event, CUstream stream))                \
	Y(limiter, CUresult, cuEventQuery, (CUevent event))                                  \
	Y(limiter, CUresult, cuEventElapsedTime, (float *ms, CUevent start, CUevent end))    \
	Y(limiter, CUresult, cuCtxGetDevice, (CUdevice *device))
LIMITER_HELPERS(HCS_DECLARE_REAL)

struct pair { CUevent start, end; int device; int busy; };
static struct pair pairs[PAIRS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable;

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void resolve(void)
{
	LIMITER_HELPERS(HCS_RESOLVE_REAL)
	usable = real_cuEventCreate && real_cuEventRecord && real_cuEventQuery &&
		 real_cuEventElapsedTime && real_cuCtxGetDevice;
	if (!usable)
		hcs_log("the driver lacks CUDA event calls; compute share not enforced");
}

int hcs_compute_share(int *device)
{
	if (!hcs_enforcing())
		return 0;
	pthread_once(&once, resolve);
	CUdevice current = 0;
	if (!usable || real_cuCtxGetDevice(&current) != CUDA_SUCCESS || current < 0 ||
	    current >= hcs_cfg.ndevices || current >= HCS_MAX_DEVICES)
		return 0;
	int share = hcs_cfg.compute_percent[current];
	*device = current;
	return share > 0 && share < 100 ? share : 0;
}

/* With the lock held: the device time of this process's finished pairs, per device. */
static void reap(uint64_t busy_ns[HCS_MAX_DEVICES])
{
	for (int i = 0; i < PAIRS; i++) {
		struct pair *p = &pairs[i];
		if (p->busy != 2 || real_cuEventQuery(p->end) != CUDA_SUCCESS)
			continue;
		float ms = 0;
		if (real_cuEventElapsedTime(&ms, p->start, p->end) == CUDA_SUCCESS && ms > 0)
			busy_ns[p->device] += (uint64_t)(ms * 1e6);
		p->busy = 1; /* events kept for reuse */
	}
}

/* The budget is the container's (in its region, shared by all its processes): each adds the
 * device time its own kernels took, and each waits while the total exceeds the share. */
void hcs_throttle(int device, int share)
{
	for (;;) {
		uint64_t busy_ns[HCS_MAX_DEVICES] = {0};
		pthread_mutex_lock(&lock);
		reap(busy_ns);
		pthread_mutex_unlock(&lock);
		long long now = now_ns();
		double wait_ns = 0;
		for (int d = 0; d < HCS_MAX_DEVICES; d++) {
			if (!busy_ns[d] && d != device)
				continue;
			struct hcs_region_budget *b = hcs_budget_lock(d);
			if (!b)
				return;
			b->busy_ns += busy_ns[d];
			if (d == device) {
				if (!b->window_start || now - b->window_start > WINDOW_NS) {
					/* carry the excess into the next window: a long kernel is
					 * paid for */
					uint64_t allowed = b->window_start
						? (uint64_t)(now - b->window_start) * (uint64_t)share / 100
						: 0;
					b->busy_ns = b->window_start && b->busy_ns > allowed
						? b->busy_ns - allowed : 0;
					b->window_start = now;
				}
				double elapsed = (double)(now - b->window_start);
				wait_ns = (double)b->busy_ns * 100.0 / share - elapsed;
			}
			hcs_budget_unlock();
		}
		if (wait_ns <= 0)
			return;
		if (wait_ns > 50e6)
			wait_ns = 50e6;
		struct timespec pause = {0, (long)wait_ns};
		nanosleep(&pause, NULL);
	}
}

void hcs_limiter_fork(enum hcs_fork_phase phase)
{
	if (phase == HCS_FORK_PREPARE) {
		pthread_mutex_lock(&lock);
	} else if (phase == HCS_FORK_PARENT) {
		pthread_mutex_unlock(&lock);
	} else {
		/* The parent's events belong to its context, not the child's. */
		memset(pairs, 0, sizeof(pairs));
		pthread_mutex_init(&lock, NULL);
	}
}

/* A free event pair (creating its events on first use); -1 when the pool is exhausted. */
int hcs_pair_begin(int device, CUstream stream)
{
	pthread_mutex_lock(&lock);
	int chosen = -1;
	for (int i = 0; i < PAIRS && chosen < 0; i++)
		if (pairs[i].busy == 1 || (pairs[i].busy == 0 && !pairs[i].start))
			chosen = i;
	if (chosen >= 0) {
		struct pair *p = &pairs[chosen];
		if (!p->start && (real_cuEventCreate(&p->start, 0) != CUDA_SUCCESS ||
				  real_cuEventCreate(&p->end, 0) != CUDA_SUCCESS)) {
			p->start = p->end = NULL;
			chosen = -1;
		} else {
			p->device = device;
			p->busy = 3; /* being recorded */
			real_cuEventRecord(p->start, stream);
		}
	}
	pthread_mutex_unlock(&lock);
	return chosen;
}

void hcs_pair_end(int index, CUstream stream)
{
	if (index < 0)
		return;
	pthread_mutex_lock(&lock);
	real_cuEventRecord(pairs[index].end, stream);
	pairs[index].busy = 2;
	pthread_mutex_unlock(&lock);
}
