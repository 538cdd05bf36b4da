/*
 * A fake libnvidia-ml.so.1: the NVML calls HCS's NVIDIA backend makes, with NVML's real ABI
 * (types and versioned symbol names as in nvml.h), answering from a config file named by
 * FAKE_NVML_CONFIG. The real pynvml bindings load it, so the backend is tested through the same
 * ctypes calls it makes against the driver.
 *
 *   driver version=550.54.15
 *   device uuid=GPU-... name="NVIDIA A100-SXM4-80GB" bus=00000000:17:00.0 memory=85899345920
 *          cc=8.0 minor=0 mig=0 ecc_uncorrected=0 retired=unsupported lost=0 ...
 *   nvlink device=0 link=0 remote=00000000:31:00.0 version=3 errors=0
 *   topo a=0 b=1 level=10 p2p=0
 *   process device=0 pid=4242 used=1073741824 kind=compute      (kind: compute or graphics)
 *
 * Sub-health readings, re-read when the file changes (a test moves them while hcsd polls):
 * `sm_clock` is the maximum SM clock and `sm_clock_now` the current one (default: the maximum);
 * `clock_reasons` the nvmlClocksEventReason* bitmask (default 0: nothing holds the clocks down);
 * `retired_pending=1` a page retirement waiting for a reboot; `remap_pending=1` likewise for
 * row remapping. A device with clock_reasons=unsupported answers NOT_SUPPORTED. `util` is the
 * GPU utilization in percent (default 100: a working GPU; `unsupported` answers NOT_SUPPORTED,
 * `fail` NVML_ERROR_UNKNOWN),
 * `app_clock` the SM application clock (default: the maximum SM clock).
 *
 * Processes also come from FAKE_GPU_STATE: the directory where the fake CUDA driver
 * (fake_cuda.c) keeps one file per live process with its usage per GPU, so a process that
 * really allocates through the fake driver shows up here as it would in the real NVML.
 * A device with processes=unsupported answers NOT_SUPPORTED to the process queries.
 * Built with FAKE_NVML_V1_ONLY, only the unversioned (v1 layout) process queries exist, as in
 * drivers older than 450, and the clock reasons only under their old name (ThrottleReasons).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/types.h>

#include "fakecfg.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
};
#define MAX_DEVICES 16
#define MAX_LINKS 18
#define MAX_PROCESSES 4096
#define ENV "FAKE_NVML_CONFIG"

struct nvmlDevice_st {
    const struct cfg_record *rec;
    int index;
};
static struct cfg config;
static struct nvmlDevice_st devices[MAX_DEVICES];
/* nvlink records by device and link, indexed once per load (calls stay O(1), as NVML's are) */
static const struct cfg_record *links[MAX_DEVICES][MAX_LINKS];
/* process records, in file order */
static const struct cfg_record *processes[CFG_MAX_RECORDS];
static int process_count;
static int device_count, initialised;
static char driver_version[80] = "550.54.15";

static void index_config(void) {
    device_count = 0;
    process_count = 0;
    memset(links, 0, sizeof(links));
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "device") == 0 && device_count < MAX_DEVICES) {
            devices[device_count].rec = rec;
            devices[device_count].index = device_count;
            device_count++;
        } else if (strcmp(rec->kind, "nvlink") == 0) {
            long d = cfg_long(rec, "device", -1), l = cfg_long(rec, "link", -1);
            if (d >= 0 && d < MAX_DEVICES && l >= 0 && l < MAX_LINKS) links[d][l] = rec;
        } else if (strcmp(rec->kind, "process") == 0) {
            processes[process_count++] = rec;
        } else if (strcmp(rec->kind, "driver") == 0) {
            cfg_str(driver_version, sizeof(driver_version), rec, "version");
        }
    }
}

static nvmlReturn_t check(nvmlDevice_t device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device < devices || device >= devices + device_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (cfg_long(device->rec, "lost", 0)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* Counters: re-read the file when it changed, so a test can raise them while hcsd polls. */
static void refresh(void) {
    if (cfg_changed(&config, ENV) && cfg_load(&config, ENV) >= 0) index_config();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (cfg_load(&config, ENV) < 0) return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    index_config();
    initialised++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}
const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, driver_version);
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)device_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)device_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t r = check(device);
    return r ? r : copy_string(uuid, length, cfg_get(device->rec, "uuid", ""));
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t r = check(device);
    return r ? r : copy_string(name, length, cfg_get(device->rec, "name", ""));
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    *minor = (unsigned int)cfg_long(device->rec, "minor", device->index);
    return NVML_SUCCESS;
}
static unsigned long long processes_used(nvmlDevice_t device);
/* `used` is what the driver itself holds; the processes' usage comes on top, as on a GPU. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    memory->total = cfg_ull(device->rec, "memory", 0);
    memory->used = cfg_ull(device->rec, "used", 0) + processes_used(device);
    memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id, unsigned int device_id) {
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    sscanf(bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = device_id;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    fill_pci(pci, cfg_get(device->rec, "bus", ""), (unsigned int)cfg_ull(device->rec, "pci_id", 0x20B210DE));
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    if (sscanf(cfg_get(device->rec, "cc", "8.0"), "%d.%d", major, minor) != 2) return 999;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    if (type == 1) *clock = (unsigned int)cfg_long(device->rec, "sm_clock", 1410);
    else if (type == 2) *clock = (unsigned int)cfg_long(device->rec, "mem_clock", 1593);
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
/* nvmlDeviceGetApplicationsClock(nvmlDevice_t, nvmlClockType_t, unsigned int *clockMHz): the
 * clock the GPU runs work at when application clocks are set; NVML_CLOCK_SM only here. */
nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    if (type != 1) return NVML_ERROR_NOT_SUPPORTED;
    *clock = (unsigned int)cfg_long(device->rec, "app_clock", cfg_long(device->rec, "sm_clock", 1410));
    return NVML_SUCCESS;
}
/* nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *): percent of the last sample
 * period a kernel ran (gpu) and memory was read or written (memory). */
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    if (strcmp(cfg_get(device->rec, "util", "100"), "unsupported") == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (strcmp(cfg_get(device->rec, "util", "100"), "fail") == 0) return 999; /* NVML_ERROR_UNKNOWN */
    utilization->gpu = utilization->memory = (unsigned int)cfg_long(device->rec, "util", 100);
    return NVML_SUCCESS;
}
/* nvmlDeviceGetClockInfo(nvmlDevice_t, nvmlClockType_t, unsigned int *clock): the current
 * clock in MHz; NVML_CLOCK_SM is 1, NVML_CLOCK_MEM 2. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    long max_sm = cfg_long(device->rec, "sm_clock", 1410);
    if (type == 1) *clock = (unsigned int)cfg_long(device->rec, "sm_clock_now", max_sm);
    else if (type == 2) *clock = (unsigned int)cfg_long(device->rec, "mem_clock", 1593);
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
/* nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t, unsigned long long *) since driver 535;
 * nvmlDeviceGetCurrentClocksThrottleReasons, its deprecated name, before and still (the only
 * one in the FAKE_NVML_V1_ONLY build, an older driver). */
static nvmlReturn_t clock_reasons(nvmlDevice_t device, unsigned long long *reasons) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    refresh();
    if (strcmp(cfg_get(device->rec, "clock_reasons", "0"), "unsupported") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *reasons = strtoull(cfg_get(device->rec, "clock_reasons", "0"), NULL, 0);
    return NVML_SUCCESS;
}
#ifndef FAKE_NVML_V1_ONLY
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return clock_reasons(device, reasons);
}
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return clock_reasons(device, reasons);
}
/* nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t, nvmlEnableState_t *isPending) */
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    if (strcmp(cfg_get(device->rec, "retired", "supported"), "unsupported") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *pending = cfg_long(device->rec, "retired_pending", 0) ? 1 : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    *limit = (unsigned int)cfg_long(device->rec, "power", 400000);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    const char *mig = cfg_get(device->rec, "mig", "unsupported");
    if (strcmp(mig, "unsupported") == 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)atoi(mig);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    (void)counter_type;
    refresh();
    if (strcmp(cfg_get(device->rec, "ecc", "on"), "off") == 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = cfg_ull(device->rec, error_type ? "ecc_uncorrected" : "ecc_corrected", 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                       unsigned long long *addresses) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    if (strcmp(cfg_get(device->rec, "retired", "supported"), "unsupported") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int have = (unsigned int)cfg_long(device->rec, cause ? "retired_dbe" : "retired_sbe", 0);
    if (*count < have) {
        *count = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < have; i++) addresses[i] = 0x1000ULL * (i + 1);
    *count = have;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected,
                                       unsigned int *uncorrected, unsigned int *pending,
                                       unsigned int *failed) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    if (strcmp(cfg_get(device->rec, "remap", "supported"), "unsupported") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *corrected = (unsigned int)cfg_long(device->rec, "remap_corrected", 0);
    *uncorrected = (unsigned int)cfg_long(device->rec, "remap_uncorrected", 0);
    *pending = (unsigned int)cfg_long(device->rec, "remap_pending", 0);
    *failed = (unsigned int)cfg_long(device->rec, "remap_failed", 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    refresh();
    *value = (unsigned int)cfg_long(device->rec, "replays", 0);
    return NVML_SUCCESS;
}

static const struct cfg_record *find_link(nvmlDevice_t device, unsigned int link) {
    return links[device->index][link];
}
static nvmlReturn_t link_check(nvmlDevice_t device, unsigned int link) {
    nvmlReturn_t r = check(device);
    if (r) return r;
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    /* Devices without NVLink answer NOT_SUPPORTED, as PCIe-only boards do. */
    int any = 0;
    for (unsigned int l = 0; l < MAX_LINKS; l++) any |= find_link(device, l) != NULL;
    return any ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active) {
    nvmlReturn_t r = link_check(device, link);
    if (r) return r;
    *active = find_link(device, link) != NULL;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) {
    nvmlReturn_t r = link_check(device, link);
    if (r) return r;
    const struct cfg_record *rec = find_link(device, link);
    if (!rec) return NVML_ERROR_INVALID_ARGUMENT;
    *version = (unsigned int)cfg_long(rec, "version", 3);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = link_check(device, link);
    if (r) return r;
    const struct cfg_record *rec = find_link(device, link);
    if (!rec) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, cfg_get(rec, "remote", ""), 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                             unsigned long long *value) {
    nvmlReturn_t r = link_check(device, link);
    if (r) return r;
    refresh();
    const struct cfg_record *rec = find_link(device, link);
    if (!rec) return NVML_ERROR_INVALID_ARGUMENT;
    *value = counter == 1 ? cfg_ull(rec, "errors", 0) : 0; /* DL_RECOVERY */
    return NVML_SUCCESS;
}

static const struct cfg_record *find_pair(nvmlDevice_t a, nvmlDevice_t b) {
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "topo") != 0) continue;
        long x = cfg_long(rec, "a", -1), y = cfg_long(rec, "b", -1);
        if ((x == a->index && y == b->index) || (x == b->index && y == a->index)) return rec;
    }
    return NULL;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int caps, int *status) {
    nvmlReturn_t r = check(a) ? check(a) : check(b);
    if (r) return r;
    (void)caps;
    const struct cfg_record *rec = find_pair(a, b);
    *status = rec ? (int)cfg_long(rec, "p2p", 0) : 0; /* 0 = NVML_P2P_STATUS_OK */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    nvmlReturn_t r = check(a) ? check(a) : check(b);
    if (r) return r;
    const struct cfg_record *rec = find_pair(a, b);
    *level = rec ? (int)cfg_long(rec, "level", 30) : 30; /* NVML_TOPOLOGY_HOSTBRIDGE */
    return NVML_SUCCESS;
}

/* ---- processes ------------------------------------------------------------------------- */

typedef struct { /* nvmlProcessInfo_v1_t */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct { /* nvmlProcessInfo_v2_t, and nvmlProcessInfo_t (v3) has the same layout */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

struct proc_entry {
    unsigned int pid;
    unsigned long long used;
};

/* A process holds device memory until it exits: the driver releases it when the process's
 * files close, before it turns zombie. */
static int holds_memory(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], stat[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *end = strrchr(stat, ')');
    return !(end && end[1] == ' ' && end[2] == 'Z');
}

/* Usage the fake CUDA driver published for this device: lines `<gpu> <bytes>` per live pid,
 * where <gpu> is the device's uuid or `index:N`. A dead (or zombie) process's file is ignored. */
static int collect_state(nvmlDevice_t device, struct proc_entry *out, int n) {
    const char *dir = getenv("FAKE_GPU_STATE");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return n;
    char index[32];
    snprintf(index, sizeof(index), "index:%d", device->index);
    const char *uuid = cfg_get(device->rec, "uuid", "");
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL && n < MAX_PROCESSES) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        if (!holds_memory((pid_t)pid)) continue;
        char path[4096], line[256], gpu[128];
        snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long used = 0, bytes;
        int found = 0;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "%127s %llu", gpu, &bytes) == 2 &&
                (strcmp(gpu, uuid) == 0 || strcmp(gpu, index) == 0)) {
                used += bytes;
                found = 1;
            }
        fclose(f);
        if (found) out[n++] = (struct proc_entry){(unsigned int)pid, used};
    }
    closedir(d);
    return n;
}

static int collect(nvmlDevice_t device, int graphics, struct proc_entry *out) {
    int n = 0;
    for (int i = 0; i < process_count && n < MAX_PROCESSES; i++) {
        const struct cfg_record *rec = processes[i];
        if (cfg_long(rec, "device", -1) != device->index) continue;
        int is_graphics = strcmp(cfg_get(rec, "kind", "compute"), "graphics") == 0;
        if (is_graphics != graphics) continue;
        out[n++] = (struct proc_entry){(unsigned int)cfg_long(rec, "pid", 0), cfg_ull(rec, "used", 0)};
    }
    return graphics ? n : collect_state(device, out, n);
}

static unsigned long long processes_used(nvmlDevice_t device) {
    static struct proc_entry entries[MAX_PROCESSES];
    unsigned long long sum = 0;
    for (int graphics = 0; graphics < 2; graphics++) {
        int n = collect(device, graphics, entries);
        for (int i = 0; i < n; i++) sum += entries[i].used;
    }
    return sum;
}

/* The NVML contract: with *count too small (or infos NULL while processes run) the call
 * answers INSUFFICIENT_SIZE and sets *count to the number needed; no processes is SUCCESS
 * with *count = 0. `v1` selects the two-field layout of the unversioned entry points. */
static nvmlReturn_t list(nvmlDevice_t device, int graphics, unsigned int *count, void *infos, int v1) {
    static struct proc_entry entries[MAX_PROCESSES];
    nvmlReturn_t r = check(device);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    refresh();
    if (strcmp(cfg_get(device->rec, "processes", "supported"), "unsupported") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = (unsigned int)collect(device, graphics, entries);
    if (n > *count || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + i;
            info->pid = entries[i].pid;
            info->usedGpuMemory = entries[i].used;
        } else {
            nvmlProcessInfo_v2_t *info = (nvmlProcessInfo_v2_t *)infos + i;
            info->pid = entries[i].pid;
            info->usedGpuMemory = entries[i].used;
            info->gpuInstanceId = info->computeInstanceId = 0xFFFFFFFFu; /* not MIG */
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos) {
    return list(device, 0, count, infos, 1);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                   nvmlProcessInfo_v1_t *infos) {
    return list(device, 1, count, infos, 1);
}
#ifndef FAKE_NVML_V1_ONLY
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return list(device, 0, count, infos, 0);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return list(device, 0, count, infos, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_v2_t *infos) {
    return list(device, 1, count, infos, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_v2_t *infos) {
    return list(device, 1, count, infos, 0);
}
#endif
