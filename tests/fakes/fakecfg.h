/*
 * Tiny configuration reader shared by the fake vendor libraries.
 *
 * A config file is a list of records, one per line: a kind, then key=value pairs; values may be
 * double-quoted to hold spaces. Lines starting with '#' are comments. The tests write these
 * files; the fakes read them on init (and again when the file changes, for counters).
 */
#ifndef HCS_FAKECFG_H
#define HCS_FAKECFG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Enough for an 8-GPU node with NVLinks, topology and a few hundred processes. */
#define CFG_MAX_RECORDS 1024
#define CFG_MAX_PAIRS 40
#define CFG_KEY 40
#define CFG_VALUE 128

struct cfg_record {
    char kind[CFG_KEY];
    int pairs;
    char keys[CFG_MAX_PAIRS][CFG_KEY];
    char values[CFG_MAX_PAIRS][CFG_VALUE];
};

struct cfg {
    int count;
    struct timespec mtime;
    struct cfg_record records[CFG_MAX_RECORDS];
};

static void cfg_copy(char *dst, size_t size, const char *src, size_t len) {
    if (len >= size) len = size - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static void cfg_parse_line(struct cfg *cfg, char *line) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\0' || cfg->count >= CFG_MAX_RECORDS) return;
    struct cfg_record *rec = &cfg->records[cfg->count++];
    memset(rec, 0, sizeof(*rec));
    char *start = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
    cfg_copy(rec->kind, sizeof(rec->kind), start, (size_t)(p - start));
    while (*p && rec->pairs < CFG_MAX_PAIRS) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        start = p;
        while (*p && *p != '=' && *p != ' ' && *p != '\n') p++;
        if (*p != '=') break;
        cfg_copy(rec->keys[rec->pairs], CFG_KEY, start, (size_t)(p - start));
        p++;
        if (*p == '"') {
            start = ++p;
            while (*p && *p != '"') p++;
            cfg_copy(rec->values[rec->pairs], CFG_VALUE, start, (size_t)(p - start));
            if (*p == '"') p++;
        } else {
            start = p;
            while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
            cfg_copy(rec->values[rec->pairs], CFG_VALUE, start, (size_t)(p - start));
        }
        rec->pairs++;
    }
}

/* Load the file named by environment variable `env`; returns -1 when unset or unreadable. */
static int cfg_load(struct cfg *cfg, const char *env) {
    const char *path = getenv(env);
    if (!path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) == 0) cfg->mtime = st.st_mtim;
    cfg->count = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f)) cfg_parse_line(cfg, line);
    fclose(f);
    return cfg->count;
}

/* Reload when the file's modification time changed (tests raise counters this way). */
static int cfg_changed(const struct cfg *cfg, const char *env) {
    const char *path = getenv(env);
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    return st.st_mtim.tv_sec != cfg->mtime.tv_sec || st.st_mtim.tv_nsec != cfg->mtime.tv_nsec;
}

static const char *cfg_get(const struct cfg_record *rec, const char *key, const char *fallback) {
    for (int i = 0; i < rec->pairs; i++)
        if (strcmp(rec->keys[i], key) == 0) return rec->values[i];
    return fallback;
}

static unsigned long long cfg_ull(const struct cfg_record *rec, const char *key,
                                  unsigned long long fallback) {
    const char *v = cfg_get(rec, key, NULL);
    return v ? strtoull(v, NULL, 0) : fallback;
}

static long cfg_long(const struct cfg_record *rec, const char *key, long fallback) {
    const char *v = cfg_get(rec, key, NULL);
    return v ? strtol(v, NULL, 0) : fallback;
}

static void cfg_str(char *dst, size_t size, const struct cfg_record *rec, const char *key) {
    const char *v = cfg_get(rec, key, "");
    cfg_copy(dst, size, v, strlen(v));
}

#endif
