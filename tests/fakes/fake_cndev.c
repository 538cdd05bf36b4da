/*
 * A fake libcndev.so: the CNDev calls HCS's Cambricon backend makes, with cndev.h's versioned
 * structures (each begins with `int version`), answering from FAKE_CNDEV_CONFIG:
 *
 *   device name=MLU370-X8 uuid=... memory_mb=49152 used_mb=1024 bus=0000:3d:00.0
 *          pci_device=0x0370 health=1 ecc_corrected=0 ecc_uncorrected=0 ports=2
 *          throttle=power_brake,thermal_slowdown retired_pending=1
 *   (throttle: the cndevPerformanceThrottleReason_t fields enabled, comma-separated, or
 *   `unsupported`; a card with retired_pending=unsupported answers NOT_SUPPORTED;
 *   retired_failure=1 sets isFailure, a retirement that failed)
 *   mlulink device=0 port=0 remote_uuid=... active=1
 *   process device=0 pid=4242 used_kib=1048576 virtual_kib=0       (host pid, KiB as cndev.h)
 */
#include <stddef.h>
#include <stdint.h>

#include "fakecfg.h"

#define ENV "FAKE_CNDEV_CONFIG"
typedef int cndevRet_t;
enum {
    CNDEV_SUCCESS = 0,
    CNDEV_ERROR_UNSUPPORTED_API_VERSION = 3,
    CNDEV_ERROR_UNINITIALIZED = 4,
    CNDEV_ERROR_INVALID_ARGUMENT = 5,
    CNDEV_ERROR_INVALID_DEVICE_ID = 6,
    CNDEV_ERROR_INSUFFICIENT_SPACE = 9,
    CNDEV_ERROR_NOT_SUPPORTED = 10,
    CNDEV_ERROR_INVALID_LINK = 11,
};

typedef struct { int version; unsigned number; } cndevCardInfo_t;
typedef struct { int version; uint8_t uuid[37]; uint64_t ncsUUID64; } cndevUUID_t;
typedef struct {
    int version;
    int64_t physicalMemoryTotal, physicalMemoryUsed, virtualMemoryTotal, virtualMemoryUsed;
    int64_t channelNumber;
    int64_t channelMemoryUsed[20];
    uint64_t globalMemory;
} cndevMemoryInfo_t;
typedef struct {
    int version;
    unsigned int subsystemId, deviceId;
    uint16_t vendor, subsystemVendor;
    unsigned int domain, bus, device, function;
    const char *physicalSlot;
    int slotID;
} cndevPCIeInfo_t;
typedef struct { int version; int health; } cndevCardHealthState_t;
typedef struct {
    int version;
    uint64_t oneBitError, multipleOneError, multipleError, multipleMultipleError;
    uint64_t correctedError, uncorrectedError, totalError, addressForbiddenError;
} cndevECCInfo_t;
typedef struct { int version; int isActive; int serdesState; } cndevMLULinkStatus_t;
typedef struct {
    int version;
    int64_t mcSn, baSn;
    uint32_t slotId, portId;
    uint8_t devIp[16];
    uint8_t uuid[37];
    uint32_t devIpVersion, isIpValid;
    int32_t connectType;
    uint64_t ncsUUID64;
} cndevMLULinkRemoteInfo_t;

typedef struct {
    int version;
    unsigned int pid;
    uint64_t physicalMemoryUsed; /* KiB */
    uint64_t virtualMemoryUsed;  /* KiB */
} cndevProcessInfo_t;

static struct cfg config;
static int initialised;
static const struct cfg_record *devices[64];
static int device_count;

static void index_config(void) {
    device_count = 0;
    for (int i = 0; i < config.count && device_count < 64; i++)
        if (strcmp(config.records[i].kind, "device") == 0) devices[device_count++] = &config.records[i];
}

static const struct cfg_record *find(int dev) {
    if (!initialised || dev < 0) return NULL;
    if (cfg_changed(&config, ENV) && cfg_load(&config, ENV) >= 0) index_config();
    return dev < device_count ? devices[dev] : NULL;
}

static const struct cfg_record *find_link(int dev, int port) {
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "mlulink") == 0 && cfg_long(rec, "device", -1) == dev &&
            cfg_long(rec, "port", -1) == port)
            return rec;
    }
    return NULL;
}

cndevRet_t cndevInit(int reserved) {
    (void)reserved;
    if (cfg_load(&config, ENV) < 0) return 1; /* CNDEV_ERROR_NO_DRIVER */
    index_config();
    initialised = 1;
    return CNDEV_SUCCESS;
}
cndevRet_t cndevRelease(void) {
    initialised = 0;
    return CNDEV_SUCCESS;
}
const char *cndevGetErrorString(cndevRet_t error) {
    switch (error) {
    case CNDEV_SUCCESS: return "Success";
    case CNDEV_ERROR_INVALID_DEVICE_ID: return "Invalid device id";
    case CNDEV_ERROR_NOT_SUPPORTED: return "Not supported";
    default: return "Cndev_ERROR not found!";
    }
}
cndevRet_t cndevGetDeviceCount(cndevCardInfo_t *info) {
    if (!initialised) return CNDEV_ERROR_UNINITIALIZED;
    info->number = (unsigned)device_count;
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetDeviceHandleByIndex(int index, int *handle) {
    if (!find(index)) return CNDEV_ERROR_INVALID_DEVICE_ID;
    *handle = index;
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetUUID(cndevUUID_t *info, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    memset(info->uuid, 0, sizeof(info->uuid));
    cfg_str((char *)info->uuid, sizeof(info->uuid), rec, "uuid");
    info->ncsUUID64 = cfg_ull(rec, "ncs", 0);
    return CNDEV_SUCCESS;
}
const char *cndevGetCardNameStringByDevId(int dev) {
    const struct cfg_record *rec = find(dev);
    return rec ? cfg_get(rec, "name", "") : "Unknown";
}
cndevRet_t cndevGetMemoryUsage(cndevMemoryInfo_t *info, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    info->physicalMemoryTotal = (int64_t)cfg_ull(rec, "memory_mb", 0);
    info->physicalMemoryUsed = (int64_t)cfg_ull(rec, "used_mb", 0);
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetPCIeInfo(cndevPCIeInfo_t *info, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    info->vendor = 0xcabc;
    info->deviceId = (unsigned int)cfg_ull(rec, "pci_device", 0x0370);
    info->physicalSlot = NULL;
    if (sscanf(cfg_get(rec, "bus", ""), "%x:%x:%x.%x", &info->domain, &info->bus, &info->device,
               &info->function) != 4)
        return CNDEV_ERROR_INVALID_ARGUMENT;
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetCardHealthState(cndevCardHealthState_t *state, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    state->health = (int)cfg_long(rec, "health", 1);
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetECCInfo(cndevECCInfo_t *ecc, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    memset(&ecc->oneBitError, 0, sizeof(*ecc) - offsetof(cndevECCInfo_t, oneBitError));
    ecc->correctedError = cfg_ull(rec, "ecc_corrected", 0);
    ecc->uncorrectedError = cfg_ull(rec, "ecc_uncorrected", 0);
    ecc->totalError = ecc->correctedError + ecc->uncorrectedError;
    return CNDEV_SUCCESS;
}
/* cndevGetPerformanceThrottleReason(cndevPerformanceThrottleReason_t *, cndevDevice_t) and
 * cndevGetRetiredPagesStatus(cndevRetiredPageStatus_t *, cndevDevice_t), as cndev.h (API
 * version 6) declares them; CNDEV_FEATURE_ENABLED is 1. */
typedef struct {
    int version;
    int tdp, powerSetting, clockSetting, frequencyLocked, powerBrake, thermalSlowdown;
} cndevPerformanceThrottleReason_t;
typedef struct { int version; uint32_t isPending; uint32_t isFailure; } cndevRetiredPageStatus_t;

static int listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}
cndevRet_t cndevGetPerformanceThrottleReason(cndevPerformanceThrottleReason_t *reason, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    if (!reason) return CNDEV_ERROR_INVALID_ARGUMENT;
    const char *list = cfg_get(rec, "throttle", "");
    if (strcmp(list, "unsupported") == 0) return CNDEV_ERROR_NOT_SUPPORTED;
    reason->tdp = listed(list, "tdp");
    reason->powerSetting = listed(list, "power_setting");
    reason->clockSetting = listed(list, "clock_setting");
    reason->frequencyLocked = listed(list, "frequency_locked");
    reason->powerBrake = listed(list, "power_brake");
    reason->thermalSlowdown = listed(list, "thermal_slowdown");
    return CNDEV_SUCCESS;
}
/* How many times the retired-pages query was asked (tests read it through ctypes). */
int fake_cndev_retired_calls;
cndevRet_t cndevGetRetiredPagesStatus(cndevRetiredPageStatus_t *status, int dev) {
    fake_cndev_retired_calls++;
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    if (!status) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (strcmp(cfg_get(rec, "retired_pending", "0"), "unsupported") == 0)
        return CNDEV_ERROR_NOT_SUPPORTED;
    status->isPending = cfg_long(rec, "retired_pending", 0) ? 1 : 0;
    status->isFailure = cfg_long(rec, "retired_failure", 0) ? 1 : 0;
    return CNDEV_SUCCESS;
}
int cndevGetMLULinkPortNumber(int dev) {
    const struct cfg_record *rec = find(dev);
    return rec ? (int)cfg_long(rec, "ports", 0) : 0;
}
cndevRet_t cndevGetMLULinkStatus(cndevMLULinkStatus_t *status, int dev, int link) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    if (link < 0 || link >= cfg_long(rec, "ports", 0)) return CNDEV_ERROR_INVALID_LINK;
    const struct cfg_record *port = find_link(dev, link);
    status->isActive = port ? (int)cfg_long(port, "active", 1) : 0;
    status->serdesState = status->isActive;
    return CNDEV_SUCCESS;
}
cndevRet_t cndevGetMLULinkRemoteInfo(cndevMLULinkRemoteInfo_t *info, int dev, int link) {
    const struct cfg_record *rec = find(dev);
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    const struct cfg_record *port = find_link(dev, link);
    if (!port) return CNDEV_ERROR_INVALID_LINK;
    memset(info->uuid, 0, sizeof(info->uuid));
    cfg_str((char *)info->uuid, sizeof(info->uuid), port, "remote_uuid");
    info->portId = (uint32_t)cfg_long(port, "remote_port", 0);
    return CNDEV_SUCCESS;
}

/* cndev.h's contract: *infoCount is the room in procInfo on the way in and the number of
 * processes on the way out; too little room answers INSUFFICIENT_SPACE with the count needed.
 * The caller sets the version of the first entry. */
cndevRet_t cndevGetProcessInfo(unsigned *infoCount, cndevProcessInfo_t *procInfo, int dev) {
    const struct cfg_record *rec = find(dev);
    if (!initialised) return CNDEV_ERROR_UNINITIALIZED;
    if (!rec) return CNDEV_ERROR_INVALID_DEVICE_ID;
    if (!infoCount || !procInfo) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (procInfo->version < 1 || procInfo->version > 6) return CNDEV_ERROR_UNSUPPORTED_API_VERSION;
    unsigned n = 0;
    for (int i = 0; i < config.count; i++)
        n += strcmp(config.records[i].kind, "process") == 0 &&
             cfg_long(&config.records[i], "device", -1) == dev;
    if (n > *infoCount) {
        *infoCount = n;
        return CNDEV_ERROR_INSUFFICIENT_SPACE;
    }
    unsigned k = 0;
    for (int i = 0; i < config.count && k < n; i++) {
        const struct cfg_record *p = &config.records[i];
        if (strcmp(p->kind, "process") != 0 || cfg_long(p, "device", -1) != dev) continue;
        procInfo[k].pid = (unsigned int)cfg_long(p, "pid", 0);
        procInfo[k].physicalMemoryUsed = cfg_ull(p, "used_kib", 0);
        procInfo[k].virtualMemoryUsed = cfg_ull(p, "virtual_kib", 0);
        k++;
    }
    *infoCount = n;
    return CNDEV_SUCCESS;
}
