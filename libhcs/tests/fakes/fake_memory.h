/* Device memory for the fake vendor libraries: host memory (malloc for small blocks, a
 * reserved mapping for large ones) and a table of live blocks, so a fake free of an unknown
 * pointer fails the way a real driver's does. Capacity per device from FAKE_TOTAL_MIB. */
#ifndef FAKE_MEMORY_H
#define FAKE_MEMORY_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define FAKE_SLOTS (1u << 16)
#define FAKE_DEVICES 16
#define FAKE_BIG (1u << 20)

/* alias: an imported handle to another block's memory (not counted twice). */
struct fake_block { uint64_t key; uint64_t size; int device; int used; int alias; };
static struct fake_block fake_blocks[FAKE_SLOTS];
static uint64_t fake_used[FAKE_DEVICES];
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t fake_next_handle = 0x1000;
static __thread int fake_current_device;

/* As a real driver's user-space locks, the fake's survive fork: taken around it, released in
 * the parent, re-made in the child (so a test without libhcs never hangs in the fake). */
static void fake_prepare(void) { pthread_mutex_lock(&fake_lock); }
static void fake_parent(void) { pthread_mutex_unlock(&fake_lock); }
static void fake_child(void) { pthread_mutex_init(&fake_lock, NULL); }
__attribute__((constructor)) static void fake_register_fork_handlers(void)
{
	pthread_atfork(fake_prepare, fake_parent, fake_child);
}

static __attribute__((unused)) uint64_t fake_total(void)
{
	const char *text = getenv("FAKE_TOTAL_MIB");
	return (text ? strtoull(text, NULL, 10) : 81920ULL) << 20;
}

static __attribute__((unused)) int fake_insert(uint64_t key, uint64_t size, int device)
{
	uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 48);
	for (uint32_t n = 0; n < FAKE_SLOTS; n++, i = (i + 1) & (FAKE_SLOTS - 1))
		if (fake_blocks[i].used != 1) {
			fake_blocks[i] = (struct fake_block){key, size, device, 1, 0};
			return 0;
		}
	return -1;
}

static __attribute__((unused)) struct fake_block *fake_find(uint64_t key)
{
	/* Same probe sequence as fake_insert; freed slots are marked 2 (tombstone). */
	uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 48);
	for (uint32_t n = 0; n < FAKE_SLOTS; n++, i = (i + 1) & (FAKE_SLOTS - 1)) {
		if (fake_blocks[i].used == 0)
			return NULL;
		if (fake_blocks[i].used == 1 && fake_blocks[i].key == key)
			return &fake_blocks[i];
	}
	return NULL;
}

/* Returns 0 and *out, or -1 when the device is full. `handle_only`: VMM handles. `device`
 * -1: host memory (pinned host allocations through the VMM and pool calls), never full. */
static __attribute__((unused)) int fake_alloc_on(int device, uint64_t size, int handle_only,
						 uint64_t *out)
{
	pthread_mutex_lock(&fake_lock);
	if (device >= FAKE_DEVICES || (device >= 0 && fake_used[device] + size > fake_total())) {
		pthread_mutex_unlock(&fake_lock);
		return -1;
	}
	uint64_t key;
	if (handle_only) {
		key = fake_next_handle++;
	} else if (size >= FAKE_BIG) {
		void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
		key = p == MAP_FAILED ? 0 : (uint64_t)(uintptr_t)p;
	} else {
		key = (uint64_t)(uintptr_t)malloc(size ? size : 1);
	}
	if (!key || fake_insert(key, size, device) != 0) {
		pthread_mutex_unlock(&fake_lock);
		return -1;
	}
	if (device >= 0)
		fake_used[device] += size;
	pthread_mutex_unlock(&fake_lock);
	*out = key;
	return 0;
}

static __attribute__((unused)) int fake_alloc(uint64_t size, int handle_only, uint64_t *out)
{
	return fake_alloc_on(fake_current_device, size, handle_only, out);
}

static __attribute__((unused)) int fake_free(uint64_t key, int handle_only)
{
	pthread_mutex_lock(&fake_lock);
	struct fake_block *block = key ? fake_find(key) : NULL;
	if (!block) {
		pthread_mutex_unlock(&fake_lock);
		return -1;
	}
	if (block->device >= 0 && !block->alias)
		fake_used[block->device] -= block->size;
	uint64_t size = block->size;
	block->used = 2;
	pthread_mutex_unlock(&fake_lock);
	if (!handle_only) {
		if (size >= FAKE_BIG)
			munmap((void *)(uintptr_t)key, size);
		else
			free((void *)(uintptr_t)key);
	}
	return 0;
}

/* A second handle to a block's memory (what importing an exported handle gives): 0 and *out. */
static __attribute__((unused)) int fake_alias(uint64_t original, uint64_t *out)
{
	pthread_mutex_lock(&fake_lock);
	struct fake_block *block = fake_find(original);
	int rc = -1;
	if (block) {
		uint64_t key = fake_next_handle++;
		int device = block->device;
		uint64_t size = block->size;
		if (fake_insert(key, size, device) == 0) {
			fake_find(key)->alias = 1;
			*out = key;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&fake_lock);
	return rc;
}

/* The device of a live block (-1: host), or -2 when there is none. */
static __attribute__((unused)) int fake_device_of(uint64_t key)
{
	pthread_mutex_lock(&fake_lock);
	struct fake_block *block = fake_find(key);
	int device = block ? block->device : -2;
	pthread_mutex_unlock(&fake_lock);
	return device;
}

static __attribute__((unused)) void fake_info(size_t *free_bytes, size_t *total_bytes)
{
	pthread_mutex_lock(&fake_lock);
	*total_bytes = (size_t)fake_total();
	*free_bytes = (size_t)(fake_total() - fake_used[fake_current_device]);
	pthread_mutex_unlock(&fake_lock);
}

#define FAKE_API __attribute__((visibility("default")))

#endif
