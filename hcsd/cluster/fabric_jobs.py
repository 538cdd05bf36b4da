"""Which job a pod belongs to, and on which nodes that job's pods hold accelerators.

A pod's job is named by, in this order: `hcs.io/job` (annotation, then label), then the
workload's own labels and annotations (`names.JOB_SOURCES`: coscheduling's PodGroup, Volcano,
JobSet, Kubeflow training jobs, Job by controller uid then by name); always within the pod's
namespace, and with the kind of job that named it, so that a JobSet and a Job of one name in
one namespace are two jobs.

Names are checked before use: `hcs.io/job` must be a DNS-1123 label (at most 63 characters),
the others a DNS-1123 subdomain (at most 253). Anyone who may create a pod writes these, and a
name ends up in logs and refusal reasons; a pod with a bad name counts as of no job (logged once
per namespace and source).

`JobIndex` is fed by the extender's pods informer (bound pods holding a signed assignment,
`holds.pod_info`) and by its own binds (`ClusterState.assume`): job -> node -> pods. It has its
own lock, held for one dict operation at a time, and calls nothing while it holds it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.contract.names import JOB, JOB_SIZE, JOB_SOURCES

__all__ = ["JOB_SIZE_MAX", "JobIndex", "JobKey", "job_of", "job_size", "valid_job_name"]

log = logging.getLogger(__name__)

JOB_SIZE_MAX = 100_000  # a larger hcs.io/job-size is ignored (no job is that big)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_warned: set[tuple[str, str]] = set()  # (namespace, key) already logged; bounded below
_WARNED_MAX = 1_000


@dataclass(frozen=True, slots=True)
class JobKey:
    namespace: str
    kind: str  # "hcs" (hcs.io/job), podgroup, volcano, volcano-job, jobset, kubeflow, job-uid, job
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def valid_job_name(name: str, *, label: bool = True) -> bool:
    """A DNS-1123 label (`label`) or subdomain: what `hcs.io/job` (label) or a workload's
    name may be."""
    return (_LABEL if label else _SUBDOMAIN).fullmatch(name) is not None


def _bad(namespace: str, key: str, value: str) -> None:
    if (namespace, key) in _warned or len(_warned) >= _WARNED_MAX:
        return
    _warned.add((namespace, key))
    log.warning(
        "namespace %s: a pod's %s (%d characters, %r...) is not a valid job name; "
        "its pods are treated as of no job", namespace[:63], key, len(value), value[:32]
    )  # fmt: skip


def job_of(pod: Mapping[str, Any]) -> JobKey | None:
    """The pod's job, or None when nothing names one (a lone pod) or the name is not valid."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    for source in (annotations, labels):
        name = source.get(JOB)
        if isinstance(name, str) and name:
            if valid_job_name(name):
                return JobKey(namespace, "hcs", name)
            _bad(namespace, JOB, name)
            return None
    for where, key, kind in JOB_SOURCES:
        name = (annotations if where == "annotation" else labels).get(key)
        if isinstance(name, str) and name:
            if valid_job_name(name, label=False):
                return JobKey(namespace, kind, name)
            _bad(namespace, key, name)
            return None
    return None


def job_size(pod: Mapping[str, Any]) -> int:
    """`hcs.io/job-size`: how many pods the pod's job has; 0 when not said or not a number
    in 1..JOB_SIZE_MAX."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(JOB_SIZE)
    if not isinstance(text, str) or not text.isdigit() or len(text) > 6:
        return 0
    size = int(text)
    return size if 0 < size <= JOB_SIZE_MAX else 0


class JobIndex:
    """Job -> node -> how many of its pods hold accelerators there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[JobKey, str]] = {}  # uid -> (job, node)
        self._nodes: dict[JobKey, Counter[str]] = {}

    def put(self, uid: str, job: JobKey, node: str) -> None:
        """The pod `uid` of `job` holds accelerators on `node` (replacing what it did)."""
        with self._lock:
            self._drop(uid)
            self._pods[uid] = (job, node)
            self._nodes.setdefault(job, Counter())[node] += 1

    def drop(self, uid: str) -> None:
        """The pod holds nothing any more."""
        with self._lock:
            self._drop(uid)

    def _drop(self, uid: str) -> None:
        found = self._pods.pop(uid, None)
        if found is None:
            return
        job, node = found
        counts = self._nodes[job]
        counts[node] -= 1
        if counts[node] <= 0:
            del counts[node]
        if not counts:
            del self._nodes[job]

    def nodes_of(self, job: JobKey) -> dict[str, int]:
        """Node -> the job's pods there (a copy)."""
        with self._lock:
            return dict(self._nodes.get(job, ()))

    def placed(self, job: JobKey) -> int:
        """How many of the job's pods hold accelerators somewhere."""
        with self._lock:
            counts = self._nodes.get(job)
            return counts.total() if counts else 0

    def __contains__(self, uid: object) -> bool:
        """Whether the pod holds accelerators somewhere (bound, or being bound here)."""
        with self._lock:
            return uid in self._pods

    def unplaced(self, uids: set[str]) -> set[str]:
        """Those of `uids` that hold nothing anywhere (one lock for all)."""
        with self._lock:
            return {uid for uid in uids if uid not in self._pods}

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
