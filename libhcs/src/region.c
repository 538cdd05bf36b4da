/* The usage region's format: see include/hcs_abi.h for the layout and the exact bytes of an
 * initialised empty region (which hcsd writes). A region is created whole and never rewritten
 * in place: a header that does not match is refused, not repaired, because the processes
 * using the region may be alive. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "region.h"

/* CRC-32 (IEEE 802.3, reflected, as zlib's): bit by bit, since it runs once per process. */
uint32_t hcs_crc32(const void *data, size_t length)
{
	const uint8_t *bytes = data;
	uint32_t crc = 0xFFFFFFFFu;
	for (size_t i = 0; i < length; i++) {
		crc ^= bytes[i];
		for (int bit = 0; bit < 8; bit++)
			crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
	}
	return ~crc;
}

void hcs_region_header_init(struct hcs_region_header *header)
{
	memset(header, 0, sizeof(*header));
	header->magic = HCS_REGION_MAGIC;
	header->version = HCS_REGION_VERSION;
	header->max_devices = HCS_REGION_MAX_DEVICES;
	header->max_procs = HCS_REGION_MAX_PROCS;
	header->slot_size = sizeof(struct hcs_region_proc);
	header->region_size = sizeof(struct hcs_region);
	header->crc32 = hcs_crc32(header, offsetof(struct hcs_region_header, crc32));
}

int hcs_region_check(const struct hcs_region *r, size_t size, char *why, size_t why_len)
{
	struct hcs_region_header expected;
	hcs_region_header_init(&expected);
	const struct hcs_region_header *h = &r->header;
	if (size != sizeof(struct hcs_region))
		snprintf(why, why_len, "%zu bytes, expected %zu", size, sizeof(struct hcs_region));
	else if (h->magic != expected.magic)
		snprintf(why, why_len, "no region magic");
	else if (h->crc32 != hcs_crc32(h, offsetof(struct hcs_region_header, crc32)))
		snprintf(why, why_len, "header checksum mismatch");
	else if (h->version != expected.version)
		snprintf(why, why_len, "version %u, expected %u", h->version, expected.version);
	else if (memcmp(h, &expected, sizeof(expected)) != 0)
		snprintf(why, why_len, "header fields differ from version %u's", expected.version);
	else if (r->lock_state < HCS_REGION_LOCK_READY)
		snprintf(why, why_len, "lock state %d", r->lock_state);
	else
		return 0;
	return -1;
}

int hcs_region_create(const char *path, char *why, size_t why_len)
{
	char temporary[600];
	if (snprintf(temporary, sizeof(temporary), "%s.%d.new", path, (int)getpid()) >=
	    (int)sizeof(temporary)) {
		errno = ENAMETOOLONG;
		snprintf(why, why_len, "cannot create %s (%s)", path, strerror(errno));
		return -1;
	}
	int fd = open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		snprintf(why, why_len, "cannot create %s (%s)", path, strerror(errno));
		return -1;
	}
	struct hcs_region_header header;
	hcs_region_header_init(&header);
	bool written = write(fd, &header, sizeof(header)) == (ssize_t)sizeof(header) &&
		       ftruncate(fd, sizeof(struct hcs_region)) == 0;
	int error = errno;
	close(fd);
	if (written && link(temporary, path) != 0) {
		error = errno;
		written = false;
	}
	unlink(temporary);
	if (!written) {
		errno = error;
		snprintf(why, why_len, "cannot create %s (%s)", path, strerror(error));
		return -1;
	}
	return 0;
}

struct hcs_region *hcs_region_open(const char *path, bool create, char *why, size_t why_len)
{
	/* O_NONBLOCK: a FIFO in its place must not hang the process (fstat then refuses it). */
	int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	int fd = open(path, flags);
	if (fd < 0 && errno == ENOENT && create) {
		if (hcs_region_create(path, why, why_len) != 0 && errno != EEXIST)
			return NULL;
		fd = open(path, flags);
	}
	if (fd < 0) {
		snprintf(why, why_len, "cannot open %s (%s)", path, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		snprintf(why, why_len, "%s is not a regular file", path);
		return NULL;
	}
	size_t size = st.st_size > 0 ? (size_t)st.st_size : 0;
	if (size != sizeof(struct hcs_region)) {
		close(fd);
		snprintf(why, why_len, "%s is not a usage region: %zu bytes, expected %zu", path,
			 size, sizeof(struct hcs_region));
		return NULL;
	}
	struct hcs_region *r = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int error = errno;
	close(fd);
	if (r == MAP_FAILED) {
		snprintf(why, why_len, "cannot map %s (%s)", path, strerror(error));
		return NULL;
	}
	char reason[160];
	if (hcs_region_check(r, size, reason, sizeof(reason)) != 0) {
		munmap(r, size);
		snprintf(why, why_len, "%s is not a usage region of version %d (%s); it is never "
			 "re-initialised", path, HCS_REGION_VERSION, reason);
		return NULL;
	}
	return r;
}
