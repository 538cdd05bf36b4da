/* A region that live processes use is never re-initialised: a process started after its header
 * was damaged (as a root tenant could) refuses every allocation instead, and the counters and
 * the mutex of the processes already running stay as they were. REGION is the region's path,
 * QUOTA_PROGRAM the t_quota program (exec'd as the newcomer); a 1Gi quota. */
#include <fcntl.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/hcs_abi.h"
#include "check.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

static char before[sizeof(struct hcs_region)], after[sizeof(struct hcs_region)];

static int read_region(const char *path, char *into)
{
	int fd = open(path, O_RDONLY);
	ssize_t got = fd >= 0 ? read(fd, into, sizeof(struct hcs_region)) : -1;
	if (fd >= 0)
		close(fd);
	return got == (ssize_t)sizeof(struct hcs_region) ? 0 : -1;
}

static void damage(const char *path, off_t offset, char byte)
{
	int fd = open(path, O_WRONLY);
	if (fd < 0 || pwrite(fd, &byte, 1, offset) != 1)
		printf("# cannot damage %s\n", path);
	if (fd >= 0)
		close(fd);
}

/* A new process of the container: t_quota expecting every allocation refused. Spawned (no
 * fork handlers run, so this process's own slot-taking child does not touch the region). */
static int newcomer(const char *program)
{
	extern char **environ;
	setenv("EXPECT_LIMIT", "refused", 1);
	char *argv[] = {(char *)program, NULL};
	pid_t pid;
	int status = 0;
	if (posix_spawn(&pid, program, NULL, NULL, argv, environ) != 0)
		return 127;
	unsetenv("EXPECT_LIMIT");
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(void)
{
	const char *path = getenv("REGION"), *program = getenv("QUOTA_PROGRAM");
	CUdeviceptr mine;
	size_t f, t;
	CHECK(path && program, "REGION and QUOTA_PROGRAM are set");
	if (!path || !program)
		return check_done("region");
	CHECK(cuMemAlloc_v2(&mine, 300 * MiB) == 0, "a live process holds 300Mi");
	static const struct { off_t offset; char byte; const char *what; } damages[] = {
		{0, 'X', "magic"}, {16, 1, "the process count (checksum)"}, {8, 2, "version"},
	};
	for (size_t i = 0; i < sizeof(damages) / sizeof(damages[0]); i++) {
		CHECK(read_region(path, before) == 0, "read the region");
		char saved = before[damages[i].offset];
		damage(path, damages[i].offset, damages[i].byte);
		CHECK(newcomer(program) == 0, "damaged %s: a new process refuses every allocation",
		      damages[i].what);
		size_t differ = sizeof(struct hcs_region_header);
		if (read_region(path, after) == 0)
			while (differ < sizeof(after) && before[differ] == after[differ])
				differ++;
		CHECK(differ == sizeof(after), "damaged %s: counters, slots and mutex untouched "
		      "(first change at byte %zu)", damages[i].what, differ);
		cuMemGetInfo_v2(&f, &t);
		CHECK(f == GiB - 300 * MiB, "damaged %s: the live process still counts its 300Mi: "
		      "free %zu", damages[i].what, f);
		damage(path, damages[i].offset, saved);
	}
	CHECK(cuMemFree_v2(mine) == 0, "free");
	cuMemGetInfo_v2(&f, &t);
	CHECK(f == GiB, "credited: free %zu", f);
	return check_done("region");
}
