/* The usage region's format (include/hcs_abi.h): its header, how it is created whole, opened
 * and checked. Shared by libhcs (accounting.c) and the hcs-region tool; no logging, no state:
 * failures come back as a reason in `why`. */
#ifndef HCS_REGION_H
#define HCS_REGION_H

#include <stdbool.h>
#include <stddef.h>

#include "hcs_abi.h"

uint32_t hcs_crc32(const void *data, size_t length);
/* The header every region of this version has, CRC included. */
void hcs_region_header_init(struct hcs_region_header *header);
/* 0 if `r` (of `size` bytes) is a region of this version, else -1 and the reason. */
int hcs_region_check(const struct hcs_region *r, size_t size, char *why, size_t why_len);
/* A new, initialised, empty region at `path`, written whole under a temporary name and linked
 * into place: 0, or -1 (errno set; EEXIST when one is already there) and the reason. */
int hcs_region_create(const char *path, char *why, size_t why_len);
/* The region at `path` mapped read-write, created first if `create` and there is none; NULL
 * and the reason when it cannot be opened, mapped, or is not a valid region (never fixed). */
struct hcs_region *hcs_region_open(const char *path, bool create, char *why, size_t why_len);

#endif
