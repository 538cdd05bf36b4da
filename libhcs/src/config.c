/* Reading the quota: HCS_CONFIG (the per-container quota.conf) or HCS_VRAM_QUOTA (a bare
 * process). A malformed config disables enforcement with one line on stderr; it never stops
 * the application. Runs once, from the constructor, with stack buffers only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

void hcs_config_load(void)
{
	const char *path = getenv("HCS_CONFIG");
	char why[200];
	if (path && *path) {
		char text[16384];
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t got = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (got < 0) {
			hcs_log("cannot read %s (%s); VRAM quota not enforced", path, strerror(errno));
			return;
		}
		text[got] = 0;
		struct hcs_config parsed;
		if (hcs_parse_config_text(text, &parsed, why, sizeof(why)) != 0) {
			hcs_log("malformed %s: %s; VRAM quota not enforced", path, why);
			return;
		}
		const char *slash = strrchr(path, '/');
		size_t dir = slash ? (size_t)(slash - path) : 0;
		if (dir + sizeof("/usage.shm") > sizeof(parsed.region_path)) {
			hcs_log("path %s is too long; VRAM quota not enforced", path);
			return;
		}
		memcpy(parsed.region_path, path, dir);
		strcpy(parsed.region_path + dir, dir ? "/usage.shm" : "usage.shm");
		parsed.shared = true;
		hcs_cfg = parsed;
		return;
	}
	const char *quota = getenv("HCS_VRAM_QUOTA");
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
