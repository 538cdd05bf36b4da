/* What each pointer or handle cost, so that its free subtracts exactly that.
 *
 * A fixed open-addressing table (linear probing, backward-shift deletion: no tombstones to
 * degrade it), mapped once; a process-local mutex. Keys are (value, kind) so a CUDA pointer
 * and a VMM handle with the same number never collide. When the table is full the
 * allocation is still counted (conservative) and the miss logged once. */
#include <pthread.h>
#include <sys/mman.h>

#include "internal.h"

#define TABLE_BITS 18
#define TABLE_SIZE (1u << TABLE_BITS)
#define TABLE_MASK (TABLE_SIZE - 1)

struct entry {
	uint64_t key;
	uint64_t size;
	int16_t ordinal;
	uint8_t kind;    /* 0: empty */
	uint8_t reserved[5];
};

static struct entry *table;
static uint64_t live;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
uint64_t hcs_unknown_frees;

static void map_table(void)
{
	void *memory = mmap(NULL, sizeof(struct entry) * TABLE_SIZE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	table = memory == MAP_FAILED ? NULL : memory;
	if (!table)
		hcs_log("cannot map the tracking table; frees will not be credited");
}

static inline uint32_t slot_of(uint64_t key, int kind)
{
	uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ULL;
	return (uint32_t)(h >> (64 - TABLE_BITS));
}

bool hcs_track(uint64_t key, int kind, int ordinal, uint64_t size)
{
	pthread_once(&table_once, map_table);
	if (!table)
		return false;
	pthread_mutex_lock(&table_lock);
	if (live >= TABLE_SIZE - TABLE_SIZE / 8) {
		pthread_mutex_unlock(&table_lock);
		hcs_log("tracking table full (%u entries); further frees are not credited", TABLE_SIZE);
		return false;
	}
	uint32_t i = slot_of(key, kind);
	while (table[i].kind && !(table[i].key == key && table[i].kind == kind))
		i = (i + 1) & TABLE_MASK;
	if (!table[i].kind)
		live++;
	table[i] = (struct entry){ .key = key, .size = size, .ordinal = (int16_t)ordinal,
				   .kind = (uint8_t)kind };
	pthread_mutex_unlock(&table_lock);
	return true;
}

/* With the lock held: take (key, kind) out; false if absent. Inlined: it is the free path. */
static inline __attribute__((always_inline)) bool take(uint64_t key, int kind, int *ordinal, uint64_t *size)
{
	uint32_t i = slot_of(key, kind);
	while (table[i].kind && !(table[i].key == key && table[i].kind == kind))
		i = (i + 1) & TABLE_MASK;
	if (!table[i].kind)
		return false;
	*ordinal = table[i].ordinal;
	*size = table[i].size;
	/* Backward-shift deletion keeps every probe chain unbroken. */
	uint32_t hole = i, j = i;
	for (;;) {
		j = (j + 1) & TABLE_MASK;
		if (!table[j].kind)
			break;
		uint32_t home = slot_of(table[j].key, table[j].kind);
		if (((j - home) & TABLE_MASK) >= ((j - hole) & TABLE_MASK)) {
			table[hole] = table[j];
			hole = j;
		}
	}
	table[hole].kind = 0;
	live--;
	return true;
}

bool hcs_untrack(uint64_t key, int kind, int *ordinal, uint64_t *size)
{
	pthread_once(&table_once, map_table);
	if (!table)
		return false;
	pthread_mutex_lock(&table_lock);
	bool found = take(key, kind, ordinal, size);
	if (!found)
		hcs_unknown_frees++;
	pthread_mutex_unlock(&table_lock);
	return found;
}

bool hcs_untrack_either(uint64_t key, int kind, int other_kind, int *found_kind, int *ordinal,
			uint64_t *size)
{
	pthread_once(&table_once, map_table);
	if (!table)
		return false;
	pthread_mutex_lock(&table_lock);
	*found_kind = kind;
	bool found = take(key, kind, ordinal, size);
	if (!found) {
		*found_kind = other_kind;
		found = take(key, other_kind, ordinal, size);
	}
	if (!found)
		hcs_unknown_frees++;
	pthread_mutex_unlock(&table_lock);
	return found;
}

bool hcs_lookup(uint64_t key, int kind, int *ordinal, uint64_t *size)
{
	pthread_once(&table_once, map_table);
	if (!table)
		return false;
	pthread_mutex_lock(&table_lock);
	uint32_t i = slot_of(key, kind);
	while (table[i].kind && !(table[i].key == key && table[i].kind == kind))
		i = (i + 1) & TABLE_MASK;
	bool found = table[i].kind != 0;
	if (found) {
		*ordinal = table[i].ordinal;
		*size = table[i].size;
	}
	pthread_mutex_unlock(&table_lock);
	return found;
}

void hcs_track_fork(enum hcs_fork_phase phase)
{
	if (phase == HCS_FORK_PREPARE) {
		pthread_mutex_lock(&table_lock);
	} else if (phase == HCS_FORK_PARENT) {
		pthread_mutex_unlock(&table_lock);
	} else {
		/* The child owns none of the parent's allocations: an empty table (fresh zero pages
		 * over the old ones, nothing copied), and a lock no other thread can hold. */
		if (table && mmap(table, sizeof(struct entry) * TABLE_SIZE, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
				  0) == MAP_FAILED)
			table = NULL;
		live = 0;
		pthread_mutex_init(&table_lock, NULL);
	}
}

uint64_t hcs_tracked_count(void)
{
	return __atomic_load_n(&live, __ATOMIC_RELAXED);
}
