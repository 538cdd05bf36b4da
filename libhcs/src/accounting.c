/* The usage region: one per container (a file beside quota.conf, mapped MAP_SHARED by every
 * process of the container) or one per process (HCS_VRAM_QUOTA). Format in hcs_abi.h and
 * region.c; what is counted and how is here.
 *
 * A process-shared robust mutex guards it. Totals per device are kept beside per-process
 * usage; a process that dies (even by SIGKILL) keeps its slot until someone notices: at the
 * next process's first allocation, when an allocation would exceed the quota, or when the
 * mutex reports EOWNERDEAD. Then its usage is subtracted and the totals recomputed from the
 * live slots, so a death in the middle of an update cannot leave them wrong.
 * The allocation path takes the mutex (no syscall when uncontended) and makes no syscall. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "region.h"

#define HCS_MAX_PROCS HCS_REGION_MAX_PROCS
_Static_assert(HCS_MAX_DEVICES == HCS_REGION_MAX_DEVICES, "one device count");
_Static_assert(sizeof(pthread_mutex_t) <= sizeof(((struct hcs_region *)0)->lock), "mutex fits");

static struct hcs_region *region;
static bool region_shared;
static int my_slot = -1;
static pid_t my_pid;
static pthread_once_t region_once = PTHREAD_ONCE_INIT;

static inline pthread_mutex_t *mutex_of(struct hcs_region *r)
{
	return (pthread_mutex_t *)(void *)r->lock;
}

static void init_mutex(pthread_mutex_t *lock, bool shared)
{
	pthread_mutexattr_t attr;
	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	if (shared)
		pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutex_init(lock, &attr);
	pthread_mutexattr_destroy(&attr);
}

/* A process-private region (a bare process with HCS_VRAM_QUOTA): the same format, in memory. */
static void fresh(struct hcs_region *r)
{
	memset(r, 0, sizeof(*r));
	hcs_region_header_init(&r->header);
	init_mutex(mutex_of(r), false);
	r->lock_state = HCS_REGION_LOCK_READY;
}

/* A zombie (killed, not yet reaped) or a dying process holds no device memory any more: its
 * state in /proc/<pid>/stat (after the last ')' of the command name) is Z or X. Without /proc,
 * kill(pid, 0) alone decides. */
static bool exited(int32_t pid)
{
	char path[32], text[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t got = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (got <= 0)
		return false;
	text[got] = 0;
	char *end = strrchr(text, ')');
	return end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

static bool alive(int32_t pid)
{
	if (pid <= 0)
		return false;
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return false;
	return !exited(pid);
}

/* The mutex of a shared region is set up once, by the first process that uses the region (its
 * creator may be hcsd, which writes the region from Python): lock_state 0 -> our pid while we
 * set it up -> ready (-1). A process that died while setting it up is taken over from. False
 * when it does not become ready within two seconds. */
static bool setup_lock(struct hcs_region *r)
{
	int32_t me = (int32_t)getpid();
	struct timespec pause = {0, 1000000};
	for (int waited = 0; waited < 2000; waited++) {
		int32_t state = __atomic_load_n(&r->lock_state, __ATOMIC_ACQUIRE);
		if (state == HCS_REGION_LOCK_READY)
			return true;
		bool takeover = state == 0 || (state > 0 && state != me && !alive(state));
		if (takeover && __atomic_compare_exchange_n(&r->lock_state, &state, me, false,
							    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			init_mutex(mutex_of(r), true);
			__atomic_store_n(&r->lock_state, HCS_REGION_LOCK_READY, __ATOMIC_RELEASE);
			return true;
		}
		nanosleep(&pause, NULL);
	}
	return false;
}

/* With the lock held: drop dead processes' usage and recompute totals from the slots. */
static void reclaim_dead(void)
{
	uint64_t totals[HCS_MAX_DEVICES] = {0};
	for (int s = 0; s < HCS_MAX_PROCS; s++) {
		struct hcs_region_proc *p = &region->procs[s];
		if (!p->pid)
			continue;
		if (p->pid != my_pid && !alive(p->pid)) {
			memset(p, 0, sizeof(*p));
			region->reclaimed_processes++;
			continue;
		}
		for (int d = 0; d < HCS_MAX_DEVICES; d++)
			totals[d] += p->used[d];
	}
	memcpy(region->used, totals, sizeof(totals));
}

static void lock_region(void)
{
	int rc = pthread_mutex_lock(mutex_of(region));
	if (rc == EOWNERDEAD) {
		/* The owner died mid-update: its slot and the totals may disagree. */
		reclaim_dead();
		pthread_mutex_consistent(mutex_of(region));
	}
}

static void claim_slot(void)
{
	my_pid = getpid();
	lock_region();
	reclaim_dead();
	int free_slot = -1;
	for (int s = 0; s < HCS_MAX_PROCS; s++) {
		if (region->procs[s].pid == my_pid) {
			free_slot = s;
			break;
		}
		if (!region->procs[s].pid && free_slot < 0)
			free_slot = s;
	}
	if (free_slot >= 0) {
		memset(&region->procs[free_slot], 0, sizeof(region->procs[free_slot]));
		region->procs[free_slot].pid = my_pid;
	}
	my_slot = free_slot;
	pthread_mutex_unlock(mutex_of(region));
	static int said;
	if (my_slot < 0 && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		hcs_log("all %d process slots of the container are held by live processes; this "
			"process's allocations are refused until one exits", HCS_MAX_PROCS);
}

/* A shared region that cannot be used refuses every allocation (fail closed): counting per
 * process instead would give each process the container's whole quota. */
static void refuse_region(const char *why)
{
	snprintf(hcs_cfg.refusal, sizeof(hcs_cfg.refusal), "%s", why);
	__atomic_store_n(&hcs_cfg.refuse_all, true, __ATOMIC_RELEASE);
}

static void setup_region(void)
{
	if (hcs_cfg.shared) {
		char why[900];
		region = hcs_region_open(hcs_cfg.region_path, true, why, sizeof(why));
		if (region && !setup_lock(region)) {
			snprintf(why, sizeof(why), "the lock of %s was never set up",
				 hcs_cfg.region_path);
			munmap(region, sizeof(*region));
			region = NULL;
		}
		if (!region) {
			refuse_region(why);
			return;
		}
		region_shared = true;
	} else {
		region = mmap(NULL, sizeof(*region), PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (region == MAP_FAILED) {
			region = NULL;
			hcs_cfg.enforcing = false;
			hcs_log("cannot allocate the usage region; VRAM quota not enforced");
			return;
		}
		fresh(region);
	}
	claim_slot();
}

static inline bool ready(void)
{
	pthread_once(&region_once, setup_region);
	return region != NULL;
}

/* The compute budget of a device, for the limiter to read and change under the region lock
 * (so all processes of the container draw on one budget). NULL without a region. */
struct hcs_region_budget *hcs_budget_lock(int device)
{
	if (device < 0 || device >= HCS_MAX_DEVICES || !ready())
		return NULL;
	lock_region();
	return &region->compute[device];
}

void hcs_budget_unlock(void)
{
	pthread_mutex_unlock(mutex_of(region));
}

void hcs_accounting_fork(enum hcs_fork_phase phase)
{
	/* A shared region's mutex lives in shared memory: a parent thread holding it releases it
	 * there, so the child can wait for it. A private region's would stay locked in the child's
	 * copy: take it around fork, and give the child a region of its own. */
	bool private_region = region && !region_shared;
	if (phase == HCS_FORK_PREPARE) {
		if (private_region)
			pthread_mutex_lock(mutex_of(region));
	} else if (phase == HCS_FORK_PARENT) {
		if (private_region)
			pthread_mutex_unlock(mutex_of(region));
	} else if (region) {
		if (private_region)
			fresh(region);
		claim_slot();
	}
}

static inline uint64_t limit_of(int ordinal)
{
	if (ordinal >= 0 && hcs_cfg.refuse_all)
		return 0;
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES)
		return UINT64_MAX;
	if (hcs_cfg.uniform)
		return hcs_cfg.uniform_limit;
	return ordinal < hcs_cfg.ndevices ? hcs_cfg.limit[ordinal] : UINT64_MAX;
}

uint64_t hcs_limit_of(int ordinal)
{
	if (ordinal >= 0 && hcs_cfg.shared)
		ready(); /* a shared region that cannot be used refuses everything: no room */
	return limit_of(ordinal);
}

uint64_t hcs_used_of(int ordinal)
{
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES || !ready())
		return 0;
	return __atomic_load_n(&region->used[ordinal], __ATOMIC_RELAXED);
}

int hcs_ordinal_of_uuid(const char *uuid)
{
	for (int i = 0; i < hcs_cfg.ndevices && i < HCS_MAX_DEVICES; i++)
		if (hcs_cfg.uuid[i][0] && strcmp(hcs_cfg.uuid[i], uuid) == 0)
			return i;
	return -1;
}

/* Fail closed: every allocation is refused; the reason is said once, at the first refusal
 * (a process that never allocates stays silent). */
static int refuse(void)
{
	static int said;
	if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		hcs_log("%s: refusing device memory allocations", hcs_cfg.refusal);
	return -1;
}

int hcs_reserve(int ordinal, uint64_t size)
{
	if (__builtin_expect(hcs_cfg.refuse_all, 0))
		return refuse();
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES)
		return 0;
	if (!ready())
		return hcs_cfg.refuse_all ? refuse() : 0;
	/* Usage is kept per process so that a dead one's can be dropped; a process without a
	 * slot (all held by live processes) could not be counted for long: it is refused, and
	 * tries for a slot again at each allocation. */
	if (__builtin_expect(my_slot < 0, 0)) {
		claim_slot();
		if (my_slot < 0) {
			__atomic_add_fetch(&region->refused_without_slot, 1, __ATOMIC_RELAXED);
			return -1;
		}
	}
	uint64_t limit = limit_of(ordinal);
	lock_region();
	if (size > limit || region->used[ordinal] > limit - size) {
		reclaim_dead(); /* maybe a dead process still holds what we need */
		if (size > limit || region->used[ordinal] > limit - size) {
			pthread_mutex_unlock(mutex_of(region));
			return -1;
		}
	}
	region->used[ordinal] += size;
	region->procs[my_slot].used[ordinal] += size;
	pthread_mutex_unlock(mutex_of(region));
	return 0;
}

void hcs_unreserve(int ordinal, uint64_t size)
{
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES || !ready())
		return;
	lock_region();
	/* Never below zero: a size we did not add (impossible by construction) is clamped. */
	region->used[ordinal] -= size < region->used[ordinal] ? size : region->used[ordinal];
	if (my_slot >= 0) {
		uint64_t *mine = &region->procs[my_slot].used[ordinal];
		*mine -= size < *mine ? size : *mine;
	}
	pthread_mutex_unlock(mutex_of(region));
}
