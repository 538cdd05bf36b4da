/* The usage region: one per container (a file beside quota.conf, mapped MAP_SHARED by every
 * process of the container) or one per process (HCS_VRAM_QUOTA). Layout in docs/libhcs.md.
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
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define HCS_REGION_MAGIC 0x4843535245474e31ULL /* "HCSREGN1" */
#define HCS_REGION_VERSION 2
#define HCS_MAX_PROCS 256

struct hcs_proc {
	int32_t pid;
	uint32_t reserved;
	uint64_t used[HCS_MAX_DEVICES];
};

struct hcs_region {
	uint64_t magic;
	uint32_t version;
	uint32_t max_devices;
	uint32_t max_procs;
	uint32_t reserved;
	uint64_t reclaimed_processes;
	uint64_t used[HCS_MAX_DEVICES];
	struct hcs_budget compute[HCS_MAX_DEVICES]; /* the container's compute share, shared */
	pthread_mutex_t lock;
	uint8_t lock_padding[64 - sizeof(pthread_mutex_t) % 64];
	struct hcs_proc procs[HCS_MAX_PROCS];
};

static struct hcs_region *region;
static bool region_shared;
static int my_slot = -1;
static pid_t my_pid;
static pthread_once_t region_once = PTHREAD_ONCE_INIT;

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

static void fresh(struct hcs_region *r, bool shared)
{
	memset(r, 0, sizeof(*r));
	r->version = HCS_REGION_VERSION;
	r->max_devices = HCS_MAX_DEVICES;
	r->max_procs = HCS_MAX_PROCS;
	init_mutex(&r->lock, shared);
	__atomic_store_n(&r->magic, HCS_REGION_MAGIC, __ATOMIC_RELEASE);
}

static struct hcs_region *map_shared(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		hcs_log("cannot open %s (%s); usage is counted per process", path, strerror(errno));
		return NULL;
	}
	/* flock serialises creation between the container's first processes. */
	flock(fd, LOCK_EX);
	struct stat st;
	struct hcs_region *r = MAP_FAILED;
	if (fstat(fd, &st) == 0 &&
	    (st.st_size == (off_t)sizeof(*r) || ftruncate(fd, sizeof(*r)) == 0))
		r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r != MAP_FAILED && (st.st_size != (off_t)sizeof(*r) || r->magic != HCS_REGION_MAGIC ||
				r->version != HCS_REGION_VERSION))
		fresh(r, true);
	flock(fd, LOCK_UN);
	close(fd);
	if (r == MAP_FAILED) {
		hcs_log("cannot map %s (%s); usage is counted per process", path, strerror(errno));
		return NULL;
	}
	return r;
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

/* With the lock held: drop dead processes' usage and recompute totals from the slots. */
static void reclaim_dead(void)
{
	uint64_t totals[HCS_MAX_DEVICES] = {0};
	for (int s = 0; s < HCS_MAX_PROCS; s++) {
		struct hcs_proc *p = &region->procs[s];
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
	int rc = pthread_mutex_lock(&region->lock);
	if (rc == EOWNERDEAD) {
		/* The owner died mid-update: its slot and the totals may disagree. */
		reclaim_dead();
		pthread_mutex_consistent(&region->lock);
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
	pthread_mutex_unlock(&region->lock);
	static int said;
	if (my_slot < 0 && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		hcs_log("all %d process slots of the container are held by live processes; this "
			"process's allocations are refused until one exits", HCS_MAX_PROCS);
}

static void setup_region(void)
{
	if (hcs_cfg.shared)
		region = map_shared(hcs_cfg.region_path);
	region_shared = region != NULL;
	if (!region) {
		region = mmap(NULL, sizeof(*region), PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (region == MAP_FAILED) {
			region = NULL;
			hcs_cfg.enforcing = false;
			hcs_log("cannot allocate the usage region; VRAM quota not enforced");
			return;
		}
		fresh(region, false);
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
struct hcs_budget *hcs_budget_lock(int device)
{
	if (device < 0 || device >= HCS_MAX_DEVICES || !ready())
		return NULL;
	lock_region();
	return &region->compute[device];
}

void hcs_budget_unlock(void)
{
	pthread_mutex_unlock(&region->lock);
}

void hcs_accounting_fork(enum hcs_fork_phase phase)
{
	/* A shared region's mutex lives in shared memory: a parent thread holding it releases it
	 * there, so the child can wait for it. A private region's would stay locked in the child's
	 * copy: take it around fork, and give the child a region of its own. */
	bool private_region = region && !region_shared;
	if (phase == HCS_FORK_PREPARE) {
		if (private_region)
			pthread_mutex_lock(&region->lock);
	} else if (phase == HCS_FORK_PARENT) {
		if (private_region)
			pthread_mutex_unlock(&region->lock);
	} else if (region) {
		if (private_region)
			fresh(region, false);
		claim_slot();
	}
}

uint64_t hcs_limit_of(int ordinal)
{
	if (ordinal >= 0 && hcs_cfg.refuse_all)
		return 0;
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES)
		return UINT64_MAX;
	if (hcs_cfg.uniform)
		return hcs_cfg.uniform_limit;
	return ordinal < hcs_cfg.ndevices ? hcs_cfg.limit[ordinal] : UINT64_MAX;
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
	if (ordinal < 0 || ordinal >= HCS_MAX_DEVICES || !ready())
		return 0;
	/* Usage is kept per process so that a dead one's can be dropped; a process without a
	 * slot (all held by live processes) could not be counted for long: it is refused, and
	 * tries for a slot again at each allocation. */
	if (__builtin_expect(my_slot < 0, 0)) {
		claim_slot();
		if (my_slot < 0)
			return -1;
	}
	uint64_t limit = hcs_limit_of(ordinal);
	lock_region();
	if (size > limit || region->used[ordinal] > limit - size) {
		reclaim_dead(); /* maybe a dead process still holds what we need */
		if (size > limit || region->used[ordinal] > limit - size) {
			pthread_mutex_unlock(&region->lock);
			return -1;
		}
	}
	region->used[ordinal] += size;
	region->procs[my_slot].used[ordinal] += size;
	pthread_mutex_unlock(&region->lock);
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
	pthread_mutex_unlock(&region->lock);
}
