// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only module for the end-to-end VM: registers one char-device major under each name
 * that an accelerator driver the VM kernel lacks registers in /proc/devices (Ascend,
 * Cambricon), plus one name the hcsd unit does not allow. Opening any minor succeeds (the
 * file operations have no .open), so whether an open fails says only what the device cgroup
 * of the opener allows. vm-inside.sh makes the nodes with the majors shown in /proc/devices.
 */
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/module.h>

static const char *const names[] = {
	"devdrv-cdev",        /* Ascend /dev/davinciN (the UDA driver) */
	"hisi_davinci_intf",  /* Ascend /dev/davinci_manager */
	"devmm_svm",          /* Ascend /dev/devmm_svm */
	"hisi_hdc",           /* Ascend /dev/hisi_hdc */
	"cambricon_ctl",      /* Cambricon /dev/cambricon_ctl */
	"cambricon_dev",      /* Cambricon /dev/cambricon_devN */
	"hcs_e2e_denied",     /* not in the unit: an open must fail */
};
static int majors[ARRAY_SIZE(names)];
static const struct file_operations fops = { .owner = THIS_MODULE };

static void release_all(void)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(names); i++)
		if (majors[i] > 0)
			unregister_chrdev(majors[i], names[i]);
}

static int __init hcs_e2e_chrdev_init(void)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(names); i++) {
		majors[i] = register_chrdev(0, names[i], &fops);
		if (majors[i] < 0) {
			int err = majors[i];

			majors[i] = 0;
			release_all();
			return err;
		}
	}
	return 0;
}

static void __exit hcs_e2e_chrdev_exit(void)
{
	release_all();
}

module_init(hcs_e2e_chrdev_init);
module_exit(hcs_e2e_chrdev_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("HCS end-to-end test: accelerator drivers' char-device names");
