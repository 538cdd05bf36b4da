"""Names shared by hcsd, the cluster side, the manifests (packaging/kubernetes/) and users.

One place, so that the code, the CRDs, the RBAC rules and the scheduler configuration cannot
drift apart unnoticed: tests/unit/test_manifests.py reads the manifests and checks them
against these values.
"""

from __future__ import annotations

import posixpath
import re

# --- the CRDs ---------------------------------------------------------------------------------
GROUP = "hcs.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
COMPUTE_NODES = "computenodes"  # cluster-scoped, one per node, named after the node
COMPUTE_NODE_KIND = "ComputeNode"
COMPUTE_QUOTAS = "computequotas"  # namespaced
COMPUTE_QUOTA_KIND = "ComputeQuota"
# cluster-scoped: base images, env and entrypoints per vendor (docs/runtime-profiles.md)
RUNTIME_PROFILES = "runtimeprofiles"
RUNTIME_PROFILE_KIND = "RuntimeProfile"
NODE_LABEL = f"{GROUP}/node"  # on each ComputeNode: the node's name

# Quota keys in ComputeQuota spec.hard / status.used.
QUOTA_VRAM = "vram"
QUOTA_TFLOPS = "tflops-fp16"
QUOTA_DEVICES = "devices"
QUOTA_KEYS = (QUOTA_VRAM, QUOTA_TFLOPS, QUOTA_DEVICES)

# --- the Kubernetes objects the manifests create ------------------------------------------------
NAMESPACE = "hcs-system"  # the syncers' Leases and the extender's leader Lease live here
NODE_LEASE_PREFIX = "hcs-node-"  # + node name: the syncer's heartbeat
LEADER_LEASE = "hcs-scheduler-extender"
SYNCER_ACCOUNT = "hcs-syncer"
EXTENDER_ACCOUNT = "hcs-scheduler-extender"
CONTROLLER_ACCOUNT = "hcs-controller"
CONTROLLER_LEASE = "hcs-controller"  # the isolation controller's leader Lease
KEY_SECRET = "hcs-assignment-key"  # noqa: S105 - a Secret's name, not a secret
NODE_KEYS_PORT = 8890  # the extender's node-keys endpoint (HTTPS), for hcs-syncers
NODE_KEYS_AUDIENCE = "hcs-node-keys"  # the audience of the syncers' token for it
NODE_KEYS_CA = "hcs-node-keys-ca"  # the ConfigMap with the CA the syncers check it against

# hcs-scheduler: the scheduler profile whose extender is HCS's (the chart runs upstream's
# kube-scheduler with it), and the label that keeps a pod or namespace from being sent there
# by the admission webhook (value "disabled").
SCHEDULER_NAME = "hcs-scheduler"
WEBHOOK_OPT_OUT_LABEL = f"{GROUP}/webhook"

# The extender's HTTP paths (urlPrefix + verb) as the scheduler configuration names them.
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"
BIND_VERB = "bind"
EXTENDER_PORT = 8888

# --- what pods ask for: extended resources (scheduled) ------------------------------------------
RESOURCE_VRAM = "ai.compute/vram"
RESOURCE_TFLOPS = "ai.compute/tflops-fp16"
RESOURCE_DEVICES = "ai.compute/devices"
MANAGED_RESOURCES = (RESOURCE_VRAM, RESOURCE_TFLOPS, RESOURCE_DEVICES)

# --- annotations --------------------------------------------------------------------------------
# Hints read by both the extender (pod annotations) and hcsd (local requests).
ANNOTATION_VENDORS = "hcs.io/vendors"
ANNOTATION_MODELS = "hcs.io/models"
ANNOTATION_TOPOLOGY = "hcs.io/topology-preference"
# The job a pod belongs to, as an annotation or a label, when no workload label says it (see
# JOB_LABELS); its pods are placed on one fabric domain (docs/cluster.md, Fabric domains).
JOB = f"{GROUP}/job"
# The scheduler's decision, signed (hcsd.contract.assignment).
ANNOTATION_ASSIGNMENT = "hcs.io/assignment"
# Written by the extender on a pending pod it refused that fits now, so that kube-scheduler
# retries it (hcsd/cluster/requeue.py): "<time>" only
ANNOTATION_CAPACITY_FREED = "hcs.io/capacity-freed"
# The RuntimeProfile a pod runs with: at bind the extender sets the image of each container
# that holds devices to the profile's image for the chosen vendor (and model), and signs the
# rest (env, command, args) into the assignment for hcsd (hcsd.contract.runtime_binding).
ANNOTATION_RUNTIME_PROFILE = f"{GROUP}/runtime-profile"
# Read by the extender only.
ANNOTATION_SUBSTITUTION = "hcs.io/allow-substitution"
# Read by hcs-controller: "never" keeps the pod from being evicted off a failed device: no
# eviction and no DisruptionTarget condition, one EvictionSkipped Event (docs/health.md,
# Opting out), so its owner can act. A NoExecute taint still evicts it (the taint manager
# does not read this annotation): tolerate hcs.io/accelerator-unhealthy to stay.
ANNOTATION_EVICTION = "hcs.io/eviction"
EVICTION_NEVER = "never"
# Local requests, read by hcsd for containers outside Kubernetes scheduling.
ANNOTATION_VRAM = "hcs.io/vram"
ANNOTATION_TFLOPS = "hcs.io/tflops-fp16"
ANNOTATION_DEVICES = "hcs.io/devices"
# Where the pod keeps its checkpoints (a path inside one of its volumes): hcsd injects
# HCS_RESUME_FROM with the newest complete one there (docs/runtime.md, Checkpoint resume).
ANNOTATION_CHECKPOINT_PATH = "hcs.io/checkpoint-path"

# --- jobs and fabric domains ------------------------------------------------------------------
# Where a pod's job is named, in the order read after `hcs.io/job` (annotation, then label): the
# PodGroup of coscheduling (both spellings), Volcano's PodGroup and job, JobSet, Kubeflow
# training jobs, then Job: its controller uid first (a Job deleted and re-created under one
# name is a new job), its name when no uid is there. Each entry: (where, key, kind); the short
# kind word keeps a JobSet and a Job of one name apart.
JOB_SOURCES = (
    ("label", "scheduling.x-k8s.io/pod-group", "podgroup"),
    ("label", "pod-group.scheduling.sigs.k8s.io", "podgroup"),
    ("annotation", "scheduling.k8s.io/group-name", "volcano"),
    ("label", "volcano.sh/job-name", "volcano-job"),
    ("label", "jobset.sigs.k8s.io/jobset-name", "jobset"),
    ("label", "training.kubeflow.org/job-name", "kubeflow"),
    ("label", "batch.kubernetes.io/controller-uid", "job-uid"),
    ("label", "controller-uid", "job-uid"),
    ("label", "batch.kubernetes.io/job-name", "job"),
    ("label", "job-name", "job"),
)
# How many pods the job has, when its owner knows (an annotation on each pod): the job's first
# pod then picks the smallest fabric domain the whole job fits in.
JOB_SIZE = f"{GROUP}/job-size"
# A node's fabric domain: nodes of one domain reach each other over one RDMA fabric. hcsd
# reports "ib:<subnet prefix>" for InfiniBand ("ib:<prefix>/<prefix>…" for several, hashed past
# 64 characters; hcsd.discovery.fabric), or what `discovery.fabric_domain` says
# (ComputeNode spec.fabric.domain). Letters, digits and `:._/-`, at most 64 characters.
FABRIC_DOMAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._/-]{0,63}")

# --- isolation (hcs-controller) ----------------------------------------------------------------
# The taint on a Node whose accelerators are (mostly) unhealthy; the controller touches no other.
TAINT_UNHEALTHY = f"{GROUP}/accelerator-unhealthy"
# The DisruptionTarget condition's reason on a pod holding a failed (or, by policy, degraded)
# device: a Job's podFailurePolicy matches the condition type, operators the reason.
REASON_DEVICE_FAILED = "HCSDeviceFailed"
REASON_DEVICE_DEGRADED = "HCSDeviceDegraded"

# --- CDI ----------------------------------------------------------------------------------------
CDI_KIND = "hcs.io/device"  # devices as `hcs.io/device=<uuid>` or `hcs.io/device=nvidia-0`
CDI_SPEC_NAME = "hcs.io-device.yaml"

# --- containers ---------------------------------------------------------------------------------
# A container id names the container's directory on the host and its ledger record: what the
# runtimes produce (64 hex digits from containerd and CRI-O, names from runc users), nothing
# that could climb out of a directory or forge a log line. Matched whole (`fullmatch`): a `$`
# would let a trailing newline through.
CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def container_id_problem(container_id: str) -> str | None:
    """Why `container_id` cannot be used, or None when it can (one check for every caller)."""
    if CONTAINER_ID.fullmatch(container_id):
        return None
    if not container_id:
        return "container id must not be empty"
    return (
        f"container id {container_id[:140]!r} is not 1-128 characters of letters, digits, "
        "'_', '.' and '-' starting with a letter or digit"
    )


# A chip model as a user names it in `hcs.io/models` (the profile database's names and aliases:
# "A100-SXM4-80GB", "A100 80GB", "910B"): letters, digits, spaces and `._+-/`, at most 64
# characters, at most 16 names. Anything else (a newline above all: it would forge a log line
# or a journald entry) is refused with the annotation's name, never passed on.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+/-]{0,63}")
MAX_MODELS = 16


def model_names(text: str) -> frozenset[str]:
    """The names listed in `hcs.io/models` (comma-separated); ValueError says what is wrong."""
    names = [word.strip() for word in text.split(",") if word.strip()]
    if len(names) > MAX_MODELS:
        raise ValueError(f"{ANNOTATION_MODELS}: at most {MAX_MODELS} models, got {len(names)}")
    for name in names:
        if not MODEL_NAME.fullmatch(name):
            raise ValueError(
                f"{ANNOTATION_MODELS}: {name[:70]!r} is not a model name (letters, digits, "
                "spaces and ._+-/, at most 64 characters)"
            )
    return frozenset(names)


# `hcs.io/checkpoint-path`: an absolute path in the container, in normal form (no `.`, `..`,
# doubled or trailing `/`), printable, at most PATH_MAX_CHECKPOINT characters.
PATH_MAX_CHECKPOINT = 1024


def checkpoint_path_problem(text: str) -> str | None:
    """Why `text` cannot be a checkpoint path, or None when it can (escaped, cut short)."""
    what = f"{ANNOTATION_CHECKPOINT_PATH}: {text[:140]!r}"
    if len(text) > PATH_MAX_CHECKPOINT:
        return f"{what} is longer than {PATH_MAX_CHECKPOINT} characters"
    if not text.startswith("/"):
        return f"{what} is not an absolute path in the container"
    if not text.isprintable():
        return f"{what} holds control characters"
    if ".." in text.split("/"):
        return f"{what} climbs with '..'"
    normal = "/" + posixpath.normpath(text).lstrip("/")
    if text != normal:
        return f"{what} is not in normal form (write {normal!r})"
    return None


# --- device attributes the health watcher sets, read by hcsctl, the metrics and the syncer --------
#: The sub-health reasons that hold a device degraded, comma-separated ("hw-slowdown,…").
SUBHEALTH_ATTRIBUTE = "subhealth"
#: Clock reasons every device of the node holds (a chassis power brake, a hot room): one
#: node-level condition, set on every device, none of them degraded for it.
SUBHEALTH_NODE_ATTRIBUTE = "subhealth_node"
