"""The slim copies of unbound pods that bind reads instead of a GET, and their bound.

The pods informer keeps one for each unbound pod this extender may be asked to bind: it asks
for one of the `ai.compute/*` resources, its `spec.schedulerName` is one the extender serves
and it has no scheduling gates (the API server refuses to bind a gated pod, and
kube-scheduler does not schedule one). A copy holds only what `demand.demand_of` and
`fabric_jobs.job_of` read and what the Binding's preconditions name, so its size does not
depend on what else the pod carries (`last-applied-configuration` alone can be 256 KiB);
their number is capped (`PendingCopies`), past which bind reads the pod with a GET.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from hcsd.contract.names import (
    ANNOTATION_MODELS,
    ANNOTATION_RUNTIME_PROFILE,
    ANNOTATION_SUBSTITUTION,
    ANNOTATION_TOPOLOGY,
    ANNOTATION_VENDORS,
    JOB,
    JOB_SOURCES,
    MANAGED_RESOURCES,
)

__all__ = [
    "DEFAULT_SCHEDULERS",
    "HINTS",
    "PENDING_COPIES",
    "PendingCopies",
    "bindable",
    "pending_copy",
    "scheduler_of",
]

DEFAULT_SCHEDULERS = frozenset({"default-scheduler"})  # a pod's schedulerName when unset
HINTS = (
    ANNOTATION_VENDORS,
    ANNOTATION_MODELS,
    ANNOTATION_SUBSTITUTION,
    ANNOTATION_TOPOLOGY,
    ANNOTATION_RUNTIME_PROFILE,
)
# What `fabric_jobs.job_of` reads: bind records where a job's pod went.
_JOB_ANNOTATIONS = (JOB, *(key for where, key, _ in JOB_SOURCES if where == "annotation"))
_JOB_LABELS = (JOB, *(key for where, key, _ in JOB_SOURCES if where == "label"))
PENDING_COPIES = 20_000  # copies kept at most; past it, bind GETs the pod
_HINT_BYTES = 4096  # a longer hint is no demand anyone means: no copy, bind GETs the pod


def scheduler_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")


def _asked(container: Mapping[str, Any]) -> dict[str, Any] | None:
    """The container's `ai.compute/*` limits and requests and its image (what a
    RuntimeProfile rebinds), None when it asks for none."""
    resources = container.get("resources") or {}
    kept = {
        part: {k: v for k, v in (resources.get(part) or {}).items() if k in MANAGED_RESOURCES}
        for part in ("limits", "requests")
    }
    if not any(kept.values()):
        return None
    return {"name": container.get("name"), "image": container.get("image"), "resources": kept}


def bindable(obj: Mapping[str, Any], schedulers: frozenset[str]) -> bool:
    """Whether the unbound pod is one this extender may be asked to bind: it asks for an
    `ai.compute/*` resource (kube-scheduler asks the extender to bind only those), is
    scheduled by one of `schedulers` and is not gated."""
    spec = obj.get("spec") or {}
    if spec.get("schedulingGates") or scheduler_of(obj) not in schedulers:
        return False
    return any(_asked(raw) for raw in spec.get("containers") or ())


def pending_copy(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """What bind reads of an unbound pod: uid, name, namespace, resourceVersion, the `hcs.io/*`
    hints, the labels and annotations naming its job, the scheduler's name, and the
    `ai.compute/*` resources and images of the containers asking for them (all
    `demand.demand_of`, `fabric_jobs.job_of` and image rebinding look at, and what a
    Binding's preconditions name); None when it asks
    for none, or has a hint or job name too long to be one."""
    spec = obj.get("spec") or {}
    containers = [c for c in (_asked(raw) for raw in spec.get("containers") or ()) if c]
    if not containers:
        return None
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    hints = {k: annotations[k] for k in (*HINTS, *_JOB_ANNOTATIONS) if k in annotations}
    job_labels = {k: labels[k] for k in _JOB_LABELS if k in labels}
    if any(len(str(v)) > _HINT_BYTES for v in (*hints.values(), *job_labels.values())):
        return None
    kept = ("uid", "namespace", "name", "resourceVersion")
    return {
        "metadata": {
            **{k: meta[k] for k in kept if k in meta},
            "annotations": hints,
            "labels": job_labels,
        },
        "spec": {"schedulerName": spec.get("schedulerName"), "containers": containers},
    }


class PendingCopies:
    """Which pods (by informer key) hold a copy now, at most `limit` of them.

    `admit` is asked by the informer's transform before it makes a copy, and reserves the
    place at once, so that a full list, which transforms every pod before applying any, cannot
    overshoot; `track` settles it from what the informer then keeps. A pod admitted once keeps
    its place while it stays unbound, so an update never turns its copy into a GET."""

    def __init__(self, limit: int = PENDING_COPIES) -> None:
        self.limit = limit
        self._lock = threading.Lock()  # guards _keys; held for a set operation
        self._keys: set[str] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, key: str) -> bool:
        with self._lock:
            if key in self._keys:
                return True
            if len(self._keys) >= self.limit:
                return False
            self._keys.add(key)
            return True

    def track(self, key: str, kept: bool) -> None:
        """The informer now keeps (`kept`) or does not keep a copy under `key`."""
        with self._lock:
            if kept:
                self._keys.add(key)
            else:
                self._keys.discard(key)
