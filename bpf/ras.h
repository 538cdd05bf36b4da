/* Events from ras.bpf.c: PCIe AER errors (per device) and memory-controller errors. */
#ifndef HCS_RAS_H
#define HCS_RAS_H

#define HCS_RAS_AER 1
#define HCS_RAS_MC 2
#define HCS_DEV_NAME 32

struct hcs_ras_event {
	unsigned long long ts_ns;
	unsigned int kind;          /* HCS_RAS_AER or HCS_RAS_MC */
	unsigned int status;        /* AER status bits; MC error_type */
	unsigned int severity;      /* AER: 0 non-fatal, 1 fatal, 2 correctable */
	unsigned int count;         /* MC error_count; 1 for AER */
	char dev_name[HCS_DEV_NAME];/* AER: PCI address of the reporting device */
};

#endif
