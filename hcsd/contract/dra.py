"""Names of HCS's Dynamic Resource Allocation mode, shared by the kubelet plugin, the
ResourceSlice publisher, the DeviceClasses, the admission webhook and hcsd's claim preparation.

One home, as for hcsd.contract.names: a ResourceSlice attribute spelled one way by the
publisher and another by the webhook's CEL selectors would match no device, and nothing but a
pod pending for ever would say so.

Kubernetes' rules behind the spellings:
- a DRA driver name is a DNS subdomain; attributes and capacities without a domain are in the
  driver's own (`compute.hcs.io/vendor` in CEL as `device.attributes["compute.hcs.io"].vendor`);
- a device name in a ResourceSlice is a DNS label: HCS uses the same `<vendor>-<index>` names as
  its CDI devices (`hcs.io/device=nvidia-0`), so one device has one name everywhere;
- a device taint key is a qualified name.
"""

from __future__ import annotations

from typing import Final

#: The driver name: ResourceSlices' `spec.driver`, the kubelet plugin's registered name, the
#: DeviceClasses' selectors and the allocation results all carry it.
DRIVER: Final = "compute.hcs.io"

# --- device attributes (unqualified: in the driver's domain) -------------------------------------
ATTR_VENDOR: Final = "vendor"  # string: nvidia, ascend, hygon, cambricon
ATTR_MODEL: Final = "model"  # string: the profile's model name, e.g. "A100-SXM4-80GB"
ATTR_UUID: Final = "uuid"  # string: the vendor's device uuid
ATTR_INDEX: Final = "index"  # int: hcsd's device index on the node
ATTR_PCI_BUS: Final = "pciBusID"  # string: domain:bus:device.function
ATTR_NUMA: Final = "numaNode"  # int; absent when the host does not say
ATTR_LINK_DOMAIN: Final = "linkDomain"  # string: NVLink/HCCS island id; absent without a fabric
#: string: the FP16 TFLOPS figure the extender scores with (measured, else the profile's)
ATTR_TFLOPS: Final = "tflopsFP16"

# --- consumable capacities (KEP-5075: one device's memory and compute shared among claims) -------
CAPACITY_MEMORY: Final = "memory"  # bytes
CAPACITY_COMPUTE: Final = "compute"  # percent of the device, 0-100
#: The memory a claim may consume is a multiple of this (the ResourceSlice's requestPolicy).
MEMORY_STEP_BYTES: Final = 256 * 2**20
#: A claim's compute share is a whole percent.
COMPUTE_STEP_PERCENT: Final = 1

# --- DeviceClasses --------------------------------------------------------------------------------
#: Any vendor's accelerator (the class `ai.compute/*` requests are translated to).
CLASS_ANY: Final = "ai.compute"


def vendor_class(vendor: str) -> str:
    """The DeviceClass selecting one vendor's devices: `nvidia.compute.hcs.io`."""
    return f"{vendor}.{DRIVER}"


def model_class(vendor: str, model: str) -> str:
    """The DeviceClass selecting one model's devices: `a100-sxm4-80gb.nvidia.compute.hcs.io`
    (the model in lower case, every run of other characters a dash, cut to a DNS label)."""
    slug = "".join(c if c.isascii() and c.isalnum() else "-" for c in model.lower())
    slug = "-".join(part for part in slug.split("-") if part)[:63].strip("-")
    return f"{slug}.{vendor_class(vendor)}"


# --- claims on the node ---------------------------------------------------------------------------
#: The name of the pod's `spec.resourceClaims` entry the webhook adds for `ai.compute/*`.
POD_CLAIM_NAME: Final = "hcs-accelerator"
#: CDI kind of the per-claim devices hcsd writes for the kubelet plugin's answers:
#: `compute.hcs.io/claim=<claim uid>-<device name>`.
CDI_CLAIM_KIND: Final = f"{DRIVER}/claim"

#: The scheduling gate the webhook puts on a pod naming a RuntimeProfile (`hcs.io/runtime-profile`)
#: in DRA mode: kube-scheduler leaves the pod alone until the profile gate controller has chosen
#: the vendor, set the containers' images for it and narrowed the pod's node affinity, and then
#: removes the gate (docs/runtime-profiles.md, "DRA mode").
SCHEDULING_GATE_RUNTIME_PROFILE: Final = "hcs.io/runtime-profile"

# --- device taints --------------------------------------------------------------------------------
#: On a device hcsd reports unhealthy (effect NoSchedule; NoExecute by policy); gone on recovery.
TAINT_UNHEALTHY: Final = f"{DRIVER}/unhealthy"

# --- modes ----------------------------------------------------------------------------------------
#: Node label naming the mode a node's devices are offered in: the extender's ComputeNode path or
#: DRA's ResourceSlices, never both for the same devices.
MODE_LABEL: Final = "hcs.io/mode"
MODE_EXTENDER: Final = "extender"
MODE_DRA: Final = "dra"

# --- admission ------------------------------------------------------------------------------------
#: Pod annotation the DRA-mode webhook writes: what the pod was charged against its namespace's
#: ComputeQuota, for people, and the token of the webhook's record (hcsd/cluster/claim_quota.py).
#: Its figures are never read back: a tenant may change it; the charge comes from the claim.
ANNOTATION_QUOTA_CHARGE: Final = "hcs.io/quota-charge"
