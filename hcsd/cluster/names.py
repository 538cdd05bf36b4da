"""The names the cluster side shares with its manifests (packaging/kubernetes/).

One place, so that the code, the CRDs, the RBAC rules and the scheduler configuration cannot
drift apart unnoticed: tests/unit/test_manifests.py reads the manifests and checks them
against these values.
"""

from __future__ import annotations

GROUP = "hcs.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
COMPUTE_NODES = "computenodes"  # cluster-scoped, one per node, named after the node
COMPUTE_QUOTAS = "computequotas"  # namespaced

NAMESPACE = "hcs-system"  # the syncers' Leases and the extender's leader Lease live here
NODE_LEASE_PREFIX = "hcs-node-"  # + node name: the syncer's heartbeat
LEADER_LEASE = "hcs-scheduler-extender"
SYNCER_ACCOUNT = "hcs-syncer"
EXTENDER_ACCOUNT = "hcs-scheduler-extender"
KEY_SECRET = "hcs-assignment-key"  # noqa: S105 - a Secret's name, not a secret
KEY_SECRET_FIELD = "assignment.key"  # noqa: S105 - the file name in the Secret

RESOURCE_VRAM = "ai.compute/vram"
RESOURCE_TFLOPS = "ai.compute/tflops-fp16"
RESOURCE_DEVICES = "ai.compute/devices"
MANAGED_RESOURCES = (RESOURCE_VRAM, RESOURCE_TFLOPS, RESOURCE_DEVICES)

ANNOTATION_VENDORS = "hcs.io/vendors"
ANNOTATION_MODELS = "hcs.io/models"
ANNOTATION_SUBSTITUTION = "hcs.io/allow-substitution"
ANNOTATION_TOPOLOGY = "hcs.io/topology-preference"
ANNOTATION_ASSIGNMENT = "hcs.io/assignment"

# Quota keys in ComputeQuota spec.hard / status.used.
QUOTA_VRAM = "vram"
QUOTA_TFLOPS = "tflops-fp16"
QUOTA_DEVICES = "devices"
QUOTA_KEYS = (QUOTA_VRAM, QUOTA_TFLOPS, QUOTA_DEVICES)

# The extender's HTTP paths (urlPrefix + verb) as the scheduler configuration names them.
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"
BIND_VERB = "bind"
EXTENDER_PORT = 8888
