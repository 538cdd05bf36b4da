/* Reading the quota, once, from the constructor, with stack buffers only. In a container the
 * quota.conf hcsd mounts at its fixed path decides (an unreadable or malformed one refuses
 * every allocation); a bare process uses HCS_CONFIG or HCS_VRAM_QUOTA, where a malformed
 * setting disables enforcement with one line on stderr. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

struct hcs_config hcs_cfg;

/* Kubernetes quantity -> bytes: digits[.digits] with Ki..Ei, k..E, or nothing. */
int hcs_parse_quantity(const char *text, uint64_t *out)
{
	uint64_t whole = 0, fraction = 0, scale = 1;
	const char *p = text;
	if (!p || !*p)
		return -1;
	if (*p < '0' || *p > '9')
		return -1;
	while (*p >= '0' && *p <= '9') {
		if (whole > (UINT64_MAX - 9) / 10)
			return -1;
		whole = whole * 10 + (uint64_t)(*p++ - '0');
	}
	if (*p == '.') {
		p++;
		int digits = 0;
		while (*p >= '0' && *p <= '9') {
			if (digits < 9) {
				fraction = fraction * 10 + (uint64_t)(*p - '0');
				scale *= 10;
				digits++;
			}
			p++;
		}
	}
	static const struct { const char *suffix; uint64_t factor; } units[] = {
		{"Ki", 1ULL << 10}, {"Mi", 1ULL << 20}, {"Gi", 1ULL << 30}, {"Ti", 1ULL << 40},
		{"Pi", 1ULL << 50}, {"Ei", 1ULL << 60}, {"k", 1000ULL}, {"M", 1000000ULL},
		{"G", 1000000000ULL}, {"T", 1000000000000ULL}, {"P", 1000000000000000ULL},
		{"E", 1000000000000000000ULL}, {"", 1},
	};
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(p, units[i].suffix) != 0)
			continue;
		uint64_t factor = units[i].factor;
		if (whole && factor > UINT64_MAX / whole)
			return -1;
		/* fraction * factor / scale, rounded up as Kubernetes does */
		unsigned __int128 part = (unsigned __int128)fraction * factor;
		uint64_t extra = (uint64_t)((part + scale - 1) / scale);
		uint64_t base = whole * factor;
		if (base > UINT64_MAX - extra)
			return -1;
		*out = base + extra;
		return 0;
	}
	return -1;
}

static int parse_uint(const char *text, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long value = strtoull(text, &end, 10);
	if (errno || end == text || *end || text[0] == '-')
		return -1;
	*out = value;
	return 0;
}

/* quota.conf: `key=value` lines, `#` comments, unknown keys ignored (forward compatible). */
int hcs_parse_config_text(const char *text, struct hcs_config *cfg, char *why, size_t why_len)
{
	memset(cfg, 0, sizeof(*cfg));
	bool version_seen = false;
	uint64_t declared = 0;
	const char *line = text;
	int lineno = 0;
	while (line && *line) {
		const char *next = strchr(line, '\n');
		size_t length = next ? (size_t)(next - line) : strlen(line);
		lineno++;
		char buffer[256];
		if (length >= sizeof(buffer)) {
			snprintf(why, why_len, "line %d is too long", lineno);
			return -1;
		}
		memcpy(buffer, line, length);
		buffer[length] = 0;
		line = next ? next + 1 : NULL;
		if (length && buffer[length - 1] == '\r')
			buffer[--length] = 0;
		if (!buffer[0] || buffer[0] == '#')
			continue;
		char *equals = strchr(buffer, '=');
		if (!equals) {
			snprintf(why, why_len, "line %d has no '='", lineno);
			return -1;
		}
		*equals = 0;
		const char *key = buffer, *value = equals + 1;
		uint64_t number;
		if (strcmp(key, "version") == 0) {
			if (parse_uint(value, &number) || number != 1) {
				snprintf(why, why_len, "version %s is not supported (expected 1)", value);
				return -1;
			}
			version_seen = true;
		} else if (strcmp(key, "devices") == 0) {
			if (parse_uint(value, &declared) || declared > HCS_MAX_DEVICES) {
				snprintf(why, why_len, "devices=%s: expected 0..%d", value, HCS_MAX_DEVICES);
				return -1;
			}
		} else if (strncmp(key, "device.", 7) == 0) {
			char *field;
			unsigned long index = strtoul(key + 7, &field, 10);
			if (field == key + 7 || *field != '.' || index >= HCS_MAX_DEVICES) {
				snprintf(why, why_len, "line %d: bad device key %s", lineno, key);
				return -1;
			}
			field++;
			if (strcmp(field, "vram_limit") == 0) {
				if (parse_uint(value, &number)) {
					snprintf(why, why_len, "%s=%s is not a byte count", key, value);
					return -1;
				}
				cfg->limit[index] = number;
			} else if (strcmp(field, "compute_percent") == 0) {
				if (parse_uint(value, &number) || number < 1 || number > 100) {
					snprintf(why, why_len, "%s=%s: expected 1..100", key, value);
					return -1;
				}
				cfg->compute_percent[index] = (int)number;
			} else if (strcmp(field, "uuid") == 0) {
				snprintf(cfg->uuid[index], HCS_UUID_LEN, "%s", value);
			}
			if ((int)index + 1 > cfg->ndevices)
				cfg->ndevices = (int)index + 1;
		}
	}
	if (!version_seen) {
		snprintf(why, why_len, "no version line");
		return -1;
	}
	if ((uint64_t)cfg->ndevices != declared) {
		snprintf(why, why_len, "devices=%llu but %d device entries",
			 (unsigned long long)declared, cfg->ndevices);
		return -1;
	}
	for (int i = 0; i < cfg->ndevices; i++) {
		if (!cfg->limit[i]) {
			snprintf(why, why_len, "device.%d has no vram_limit", i);
			return -1;
		}
		if (!cfg->compute_percent[i])
			cfg->compute_percent[i] = 100;
	}
	cfg->enforcing = true;
	return 0;
}

/* The region file beside a quota.conf path. */
static int region_beside(const char *path, struct hcs_config *cfg)
{
	const char *slash = strrchr(path, '/');
	size_t dir = slash ? (size_t)(slash - path) : 0;
	if (dir + sizeof("/usage.shm") > sizeof(cfg->region_path))
		return -1;
	memcpy(cfg->region_path, path, dir);
	strcpy(cfg->region_path + dir, dir ? "/usage.shm" : "usage.shm");
	return 0;
}

static int read_quota_file(const char *path, int open_flags, struct hcs_config *cfg, char *why,
			   size_t why_len)
{
	/* O_NONBLOCK: a FIFO in its place must not hang the process; fstat then refuses it. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | open_flags);
	if (fd < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 1;
		snprintf(why, why_len, "cannot open %s (%s)", path, strerror(errno));
		return -1;
	}
	char text[16384];
	struct stat st;
	ssize_t got = 0, n = 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		snprintf(why, why_len, "%s is not a regular file", path);
		return -1;
	}
	while (got < (ssize_t)sizeof(text) - 1 &&
	       (n = read(fd, text + got, sizeof(text) - 1 - (size_t)got)) > 0)
		got += n;
	int error = errno;
	char extra;
	bool longer = n > 0 && read(fd, &extra, 1) > 0;
	close(fd);
	if (n < 0) {
		snprintf(why, why_len, "cannot read %s (%s)", path, strerror(error));
		return -1;
	}
	if (longer) {
		snprintf(why, why_len, "%s is larger than %zu bytes", path, sizeof(text) - 1);
		return -1;
	}
	text[got] = 0;
	char reason[200];
	if (hcs_parse_config_text(text, cfg, reason, sizeof(reason)) != 0) {
		snprintf(why, why_len, "malformed %s: %s", path, reason);
		return -1;
	}
	if (region_beside(path, cfg) != 0) {
		snprintf(why, why_len, "path %s is too long", path);
		return -1;
	}
	cfg->shared = true;
	return 0;
}

int hcs_config_read_file(const char *path, struct hcs_config *cfg, char *why, size_t why_len)
{
	return read_quota_file(path, 0, cfg, why, why_len);
}

/* Fail closed: enforcing, no device has room, and the reason kept for the first refusal. */
static void refuse_everything(const char *why)
{
	memset(&hcs_cfg, 0, sizeof(hcs_cfg));
	hcs_cfg.enforcing = true;
	hcs_cfg.refuse_all = true;
	snprintf(hcs_cfg.refusal, sizeof(hcs_cfg.refusal), "%s", why);
}

void hcs_config_load(void)
{
	char why[256];
	struct hcs_config parsed;
	/* hcsd mounts the container's quota at a fixed path: the environment cannot move it, and
	 * a symbolic link in its place is refused rather than followed. */
	int found = read_quota_file(HCS_CONTAINER_CONFIG, O_NOFOLLOW, &parsed, why, sizeof(why));
	if (found == 0) {
		hcs_cfg = parsed;
		return;
	}
	if (found < 0) {
		refuse_everything(why);
		return;
	}
	/* A bare process: its own settings, ignored in set-uid or capability-raising programs. */
	const char *path = secure_getenv("HCS_CONFIG");
	if (path && *path) {
		found = hcs_config_read_file(path, &parsed, why, sizeof(why));
		if (found == 0) {
			hcs_cfg = parsed;
			return;
		}
		if (found > 0)
			snprintf(why, sizeof(why), "cannot read %s (%s)", path, strerror(ENOENT));
		hcs_log("%s; VRAM quota not enforced", why);
		return;
	}
	const char *quota = secure_getenv("HCS_VRAM_QUOTA");
	if (quota && *quota) {
		uint64_t limit;
		if (hcs_parse_quantity(quota, &limit) != 0 || limit == 0) {
			hcs_log("HCS_VRAM_QUOTA=%s is not a quantity such as 2Gi; not enforced", quota);
			return;
		}
		memset(&hcs_cfg, 0, sizeof(hcs_cfg));
		hcs_cfg.uniform = true;
		hcs_cfg.uniform_limit = limit;
		hcs_cfg.ndevices = HCS_MAX_DEVICES;
		for (int i = 0; i < HCS_MAX_DEVICES; i++) {
			hcs_cfg.limit[i] = limit;
			hcs_cfg.compute_percent[i] = 100;
		}
		hcs_cfg.enforcing = true;
	}
}
