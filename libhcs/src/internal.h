/* libhcs internals: configuration, accounting, tracking, logging, real-symbol resolution. */
#ifndef HCS_INTERNAL_H
#define HCS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HCS_API __attribute__((visibility("default")))
#define HCS_MAX_DEVICES 16
#define HCS_UUID_LEN 96

/* config.c: one table of settings, read once.
 * In a container (the file hcsd mounts at HCS_CONTAINER_DIR/quota.conf exists) that file is
 * the quota, whatever the environment says; if it cannot be read or parsed, every allocation
 * is refused (fail closed). Elsewhere (a bare process) HCS_CONFIG or HCS_VRAM_QUOTA, read with
 * secure_getenv, apply; a malformed one leaves the process unlimited. */
#ifndef HCS_CONTAINER_DIR
#define HCS_CONTAINER_DIR "/run/hcs" /* a test build points this at its own directory */
#endif
#define HCS_CONTAINER_CONFIG HCS_CONTAINER_DIR "/quota.conf" /* usage.shm beside it */
struct hcs_config {
	bool enforcing;           /* false: pass everything through */
	bool refuse_all;          /* fail closed: the container's quota could not be read */
	bool shared;              /* true: a container region file; false: process-private */
	int ndevices;             /* devices with a limit; 0 with `uniform` = every device */
	bool uniform;             /* HCS_VRAM_QUOTA: one limit for every device */
	uint64_t uniform_limit;
	uint64_t limit[HCS_MAX_DEVICES];
	int compute_percent[HCS_MAX_DEVICES];
	char uuid[HCS_MAX_DEVICES][HCS_UUID_LEN];
	char region_path[512];
	char refusal[1024];       /* why everything is refused, said once at the first refusal */
};
extern struct hcs_config hcs_cfg;
void hcs_config_load(void);
int hcs_parse_quantity(const char *text, uint64_t *out);
int hcs_parse_config_text(const char *text, struct hcs_config *cfg, char *why, size_t why_len);
/* A quota.conf file into cfg: 0, 1 when the file does not exist, -1 (reason in why) when it
 * cannot be read or parsed. */
int hcs_config_read_file(const char *path, struct hcs_config *cfg, char *why, size_t why_len);

/* accounting.c: the shared usage region. */
int hcs_reserve(int ordinal, uint64_t size);    /* 0 ok, -1 over quota */
void hcs_unreserve(int ordinal, uint64_t size);
uint64_t hcs_limit_of(int ordinal);             /* UINT64_MAX when unlimited */
uint64_t hcs_used_of(int ordinal);
int hcs_ordinal_of_uuid(const char *uuid);      /* -1 if the uuid has no limit entry */
/* A device's compute budget in the region (the container's busy time in the current window),
 * to read and change under the region lock; NULL without a region, else unlock after. */
struct hcs_region_budget *hcs_budget_lock(int device);
void hcs_budget_unlock(void);

/* fork: each module takes its process-local locks before fork (PREPARE), releases them in the
 * parent (PARENT) and re-makes them in the child (CHILD), so that a lock another thread held
 * at the fork never reaches the child locked. The child is a new process: its own slot, an
 * empty tracking table (what it inherited the parent owns), fresh limiter state. */
enum hcs_fork_phase { HCS_FORK_PREPARE, HCS_FORK_PARENT, HCS_FORK_CHILD };
void hcs_accounting_fork(enum hcs_fork_phase phase);
void hcs_track_fork(enum hcs_fork_phase phase);
void hcs_limiter_fork(enum hcs_fork_phase phase);
void hcs_graph_fork(enum hcs_fork_phase phase);

/* track.c: pointer/handle -> (device, size), so frees subtract exactly what was added. */
enum hcs_kind { HCS_KIND_PTR = 1, HCS_KIND_VMM = 2, HCS_KIND_HIP = 3, HCS_KIND_ACL = 4,
		HCS_KIND_RT = 5, HCS_KIND_CNRT = 6, HCS_KIND_CN = 7, HCS_KIND_RT_PHYS = 8,
		HCS_KIND_POOL = 9,   /* a memory pool: ordinal is where it lives, -1 for the host */
		HCS_KIND_ARRAY = 10, HCS_KIND_MIPMAP = 11,
		HCS_KIND_LIMIT = 12, /* a context limit's reservation: key (device << 8) | limit */
		HCS_KIND_IMPORT = 13, /* an imported VMM handle: size is what its mappings charged */
		HCS_KIND_HIP_ARRAY = 14, HCS_KIND_HIP_VMM = 15, HCS_KIND_ACL_PHYS = 16 };
bool hcs_track(uint64_t key, int kind, int ordinal, uint64_t size);
bool hcs_untrack(uint64_t key, int kind, int *ordinal, uint64_t *size);
bool hcs_lookup(uint64_t key, int kind, int *ordinal, uint64_t *size); /* entry stays */
/* A key that may be of either kind: which one it was in *found_kind. */
bool hcs_untrack_either(uint64_t key, int kind, int other_kind, int *found_kind, int *ordinal,
			uint64_t *size);
uint64_t hcs_tracked_count(void);
extern uint64_t hcs_unknown_frees;

/* sizes.c: an array's storage (CUDA and HIP arrays: same formats and flags). */
uint64_t hcs_array_element(int format, unsigned int channels);
uint64_t hcs_array_bytes(size_t width, size_t height, size_t depth, uint64_t element,
			 unsigned int flags, unsigned int levels);

/* log.c: fixed buffer, `libhcs:` prefix, capped repeats; no malloc. */
void hcs_log(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* init.c: once-only set-up and real symbol lookup. */
void hcs_init(void);
bool hcs_dlsym_ready(void);
void *hcs_real(const char *const *libraries, const char *symbol);
extern __thread int hcs_in_hook __attribute__((tls_model("initial-exec")));  /* >0 inside a hook */

/* Generic allocation bookkeeping used by every vendor backend. */
static inline bool hcs_enforcing(void)
{
	return hcs_cfg.enforcing && hcs_in_hook == 0;
}

#endif
