/*
 * A fake libdcmi.so: the DCMI calls HCS's Ascend backend makes, with the layouts of
 * dcmi_interface_api.h, answering from a config file named by FAKE_DCMI_CONFIG:
 *
 *   device card=0 device=0 logic=0 chip_name=910B3 hbm_mb=65536 hbm_used_mb=3161 health=0
 *          errors=0x80CB8009 bus=0000:c1:00.0 pci_device=0xd802 ecc_single=0 ecc_double=0
 *   topo card1=0 device1=0 card2=1 device2=0 type=3
 *   process card=0 device=0 pid=4242 used=1073741824          (host pid, bytes)
 *
 * A device with processes=unsupported answers dcmi_get_device_resource_info with
 * DCMI_ERR_NOT_SUPPORT, as chips and drivers without per-process accounting do.
 * A device with hbm_mb=0 has no HBM (310P: DDR via dcmi_get_device_memory_info_v2, memory_mb).
 */
#include "fakecfg.h"

#define ENV "FAKE_DCMI_CONFIG"
#define DCMI_OK 0
#define DCMI_ERR_INVALID_PARAMETER (-8001)
#define DCMI_ERR_INVALID_DEVICE_ID (-8007)
#define DCMI_ERR_NOT_SUPPORT (-8255)

struct dcmi_chip_info {
    unsigned char chip_type[32];
    unsigned char chip_name[32];
    unsigned char chip_ver[32];
    unsigned int aicore_cnt;
};
struct dcmi_hbm_info {
    unsigned long long memory_size;
    unsigned int freq;
    unsigned long long memory_usage;
    int temp;
    unsigned int bandwith_util_rate;
};
struct dcmi_memory_info {
    unsigned long long memory_size;
    unsigned int freq;
    unsigned int utiliza;
};
struct dcmi_pcie_info_all {
    unsigned int venderid, subvenderid, deviceid, subdeviceid;
    int domain;
    unsigned int bdf_busid, bdf_deviceid, bdf_funcid;
    unsigned char reserve[32];
};
struct dcmi_die_id {
    unsigned int soc_die[5];
};
struct dcmi_proc_mem_info {
    int proc_id;
    unsigned long proc_mem_usage; /* bytes */
};
#define MAX_PROC_NUM_IN_DEVICE 32 /* DCMI fills at most 32 entries */
struct dcmi_ecc_info {
    int enable_flag;
    unsigned int single_bit_error_cnt, double_bit_error_cnt;
    unsigned int total_single_bit_error_cnt, total_double_bit_error_cnt;
    unsigned int single_bit_isolated_pages_cnt, double_bit_isolated_pages_cnt;
};

static struct cfg config;
static int initialised;

static const struct cfg_record *find(int card, int device) {
    if (cfg_changed(&config, ENV)) cfg_load(&config, ENV);
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "device") == 0 && cfg_long(rec, "card", -1) == card &&
            cfg_long(rec, "device", -1) == device)
            return rec;
    }
    return NULL;
}

int dcmi_init(void) {
    if (cfg_load(&config, ENV) < 0) return -8005; /* DCMI_ERR_CODE_INNER_ERR */
    initialised = 1;
    return DCMI_OK;
}

int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len) {
    if (!initialised || !card_num || !card_list) return DCMI_ERR_INVALID_PARAMETER;
    int n = 0;
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "device") != 0) continue;
        int card = (int)cfg_long(rec, "card", 0), seen = 0;
        for (int j = 0; j < n; j++) seen |= card_list[j] == card;
        if (seen) continue;
        if (n >= list_len) return DCMI_ERR_INVALID_PARAMETER;
        card_list[n++] = card;
    }
    *card_num = n;
    return DCMI_OK;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    int n = 0;
    for (int i = 0; i < config.count; i++)
        n += strcmp(config.records[i].kind, "device") == 0 &&
             cfg_long(&config.records[i], "card", -1) == card_id;
    if (!n) return DCMI_ERR_INVALID_DEVICE_ID;
    *device_num = n;
    return DCMI_OK;
}

int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    *device_logic_id = (int)cfg_long(rec, "logic", 0);
    return DCMI_OK;
}

int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    memset(chip_info, 0, sizeof(*chip_info));
    cfg_str((char *)chip_info->chip_type, 32, rec, "chip_type");
    cfg_str((char *)chip_info->chip_name, 32, rec, "chip_name");
    cfg_str((char *)chip_info->chip_ver, 32, rec, "chip_ver");
    chip_info->aicore_cnt = (unsigned int)cfg_long(rec, "aicore", 20);
    return DCMI_OK;
}

int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    if (!cfg_ull(rec, "hbm_mb", 0)) return DCMI_ERR_NOT_SUPPORT;
    memset(hbm_info, 0, sizeof(*hbm_info));
    hbm_info->memory_size = cfg_ull(rec, "hbm_mb", 0);
    hbm_info->memory_usage = cfg_ull(rec, "hbm_used_mb", 0);
    hbm_info->freq = 1600;
    return DCMI_OK;
}

int dcmi_get_device_memory_info_v2(int card_id, int device_id, struct dcmi_memory_info *info) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    memset(info, 0, sizeof(*info));
    info->memory_size = cfg_ull(rec, "memory_mb", 0);
    return DCMI_OK;
}

int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    *health = (unsigned int)cfg_long(rec, "health", 0);
    return DCMI_OK;
}

int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count,
                                 unsigned int *error_code_list, unsigned int list_len) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    char codes[CFG_VALUE];
    cfg_str(codes, sizeof(codes), rec, "errors");
    int n = 0;
    for (char *tok = strtok(codes, ","); tok && (unsigned int)n < list_len; tok = strtok(NULL, ","))
        error_code_list[n++] = (unsigned int)strtoul(tok, NULL, 0);
    *error_count = n;
    return DCMI_OK;
}

int dcmi_get_device_pcie_info_v2(int card_id, int device_id, struct dcmi_pcie_info_all *pcie) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    memset(pcie, 0, sizeof(*pcie));
    pcie->venderid = 0x19e5;
    pcie->deviceid = (unsigned int)cfg_ull(rec, "pci_device", 0xd802);
    sscanf(cfg_get(rec, "bus", "0000:00:00.0"), "%x:%x:%x.%x", (unsigned int *)&pcie->domain,
           &pcie->bdf_busid, &pcie->bdf_deviceid, &pcie->bdf_funcid);
    return DCMI_OK;
}

int dcmi_get_device_die_v2(int card_id, int device_id, int input_type, struct dcmi_die_id *die) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    if (input_type != 1) return DCMI_ERR_NOT_SUPPORT; /* only VDIE here */
    for (int i = 0; i < 5; i++)
        die->soc_die[i] = (unsigned int)(0x1000 * (cfg_long(rec, "logic", 0) + 1) + i);
    return DCMI_OK;
}

int dcmi_get_device_ecc_info(int card_id, int device_id, int input_type, struct dcmi_ecc_info *ecc) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    if (input_type != 2 || !cfg_ull(rec, "hbm_mb", 0)) return DCMI_ERR_NOT_SUPPORT; /* HBM */
    memset(ecc, 0, sizeof(*ecc));
    ecc->enable_flag = 1;
    ecc->total_single_bit_error_cnt = (unsigned int)cfg_long(rec, "ecc_single", 0);
    ecc->total_double_bit_error_cnt = (unsigned int)cfg_long(rec, "ecc_double", 0);
    ecc->double_bit_isolated_pages_cnt = (unsigned int)cfg_long(rec, "isolated_pages", 0);
    return DCMI_OK;
}

int dcmi_get_topo_info_by_device_id(int card1, int device1, int card2, int device2, int *topo) {
    if (!find(card1, device1) || !find(card2, device2)) return DCMI_ERR_INVALID_DEVICE_ID;
    *topo = card1 == card2 && device1 == device2 ? 0 : 1; /* SELF, else SYS */
    for (int i = 0; i < config.count; i++) {
        const struct cfg_record *rec = &config.records[i];
        if (strcmp(rec->kind, "topo") != 0) continue;
        long c1 = cfg_long(rec, "card1", -1), d1 = cfg_long(rec, "device1", -1);
        long c2 = cfg_long(rec, "card2", -1), d2 = cfg_long(rec, "device2", -1);
        if ((c1 == card1 && d1 == device1 && c2 == card2 && d2 == device2) ||
            (c1 == card2 && d1 == device2 && c2 == card1 && d2 == device1))
            *topo = (int)cfg_long(rec, "type", 1);
    }
    return DCMI_OK;
}

/* Processes using a chip: host pids and bytes, at most 32 (the caller's array holds 32). */
int dcmi_get_device_resource_info(int card_id, int device_id, struct dcmi_proc_mem_info *proc_info,
                                  int *proc_num) {
    const struct cfg_record *rec = find(card_id, device_id);
    if (!rec) return DCMI_ERR_INVALID_DEVICE_ID;
    if (!proc_info || !proc_num) return DCMI_ERR_INVALID_PARAMETER;
    if (strcmp(cfg_get(rec, "processes", "supported"), "unsupported") == 0) return DCMI_ERR_NOT_SUPPORT;
    int n = 0;
    for (int i = 0; i < config.count && n < MAX_PROC_NUM_IN_DEVICE; i++) {
        const struct cfg_record *p = &config.records[i];
        if (strcmp(p->kind, "process") != 0 || cfg_long(p, "card", -1) != card_id ||
            cfg_long(p, "device", -1) != device_id)
            continue;
        proc_info[n].proc_id = (int)cfg_long(p, "pid", 0);
        proc_info[n].proc_mem_usage = (unsigned long)cfg_ull(p, "used", 0);
        n++;
    }
    *proc_num = n;
    return DCMI_OK;
}
